"""Instructions a step on the training thread, counted by valgrind's callgrind (inrank.py --instructions).

A clock on the 2-core VM moves by tens of percent from one hour to the next,
and inrank.py's medians of blocks need hundreds of blocks to tell a 10 us
change from its noise. An instruction count does not move with the machine's
load: the same loop counts the same instructions (a work(n) loop under this
counter: 422 a turn, the same to the instruction at 10,000 turns and 20,000).
So a change to ddptop's in-rank path can be weighed in one short run, before
and after, without a GPU.

inrank.py runs itself under callgrind with --dump-before=getloadavg: each
os.getloadavg() (mark(), which neither ddptop nor torch calls) writes the
counts since the last one, thread by thread (--separate-threads), and zeroes
them. A block marks as its timed steps begin and as they end, so every
second part is one block of one job, named in the order the blocks ran
(labels.json). The training thread is callgrind's thread 1.

ddptop's sender thread is not started while counting. It wakes on the wall
clock, every 100 ms, and callgrind slows the process about fifty times: it
would take the GIL from the training thread every other step rather than
every hundredth, and each handoff costs the training thread thousands of
instructions, more the busier the machine (a run beside another read 13,000
instructions a step more). Its own cost, and what its periodic reads cost
the training thread, are what inrank.py's clocks report apart.

What an instruction costs is not the same everywhere: a cache miss costs
hundreds of cycles, and on a GPU a torch op's host work (a launch) replaces
its CPU kernel. The count says how much work the training thread does, not
how long it takes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from scratch import scratch_folder

FOLDER = "INRANK_CALLGRIND"
"""The environment variable that tells inrank.py it runs under callgrind, and where the counts go."""

MAIN_THREAD = 1
"""callgrind's number for the process's first thread: the training thread."""


def under_callgrind() -> str | None:
    """The folder for this run's counts when this process runs under callgrind, else None."""
    return os.environ.get(FOLDER)


def mark() -> None:
    """Close a part of the count: callgrind dumps on entering getloadavg (--dump-before)."""
    os.getloadavg()


def counted(parser: argparse.ArgumentParser, script: str) -> str:
    """Run script again, with this process's arguments, under callgrind: the folder its counts
    are in. Without valgrind, parser's one-line error; a run that fails exits with its status."""
    if not shutil.which("valgrind"):
        parser.error("--instructions needs valgrind (apt-get install valgrind)")
    folder = scratch_folder("ddptop-callgrind-")
    command = [
        "valgrind",
        "--tool=callgrind",
        "--dump-before=getloadavg",
        "--separate-threads=yes",
        f"--callgrind-out-file={folder}/cg.%p",
        "--quiet",
        sys.executable,
        script,
        *sys.argv[1:],
    ]
    if returncode := subprocess.run(command, env={**os.environ, FOLDER: folder}).returncode:
        sys.exit(returncode)
    return folder


def save_labels(folder: str, labels: list[str], steps: int) -> None:
    """The job of each block, in the order they ran, and the steps a block times."""
    Path(folder, "labels.json").write_text(json.dumps({"labels": labels, "steps": steps}))


PART = re.compile(r"^cg\.\d+(?:\.(\d+))?-(\d+)$")
"""A dump's file name: cg.PID.PART-THREAD, or cg.PID-THREAD for the last part (at exit)."""


def parts(folder: str, thread: int = MAIN_THREAD) -> dict[int, int]:
    """Instructions of each part (a dump's number) on thread."""
    counted: dict[int, int] = {}
    for path in Path(folder).iterdir():
        found = PART.match(path.name)
        if found is None or int(found[2]) != thread:
            continue
        part = total = None
        with path.open() as lines:
            for line in lines:
                if line.startswith("part:"):
                    part = int(line.split()[1])
                elif line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
                if part is not None and total is not None:
                    break
        if part is not None and total is not None:
            counted[part] = total
    return counted


def per_block(folder: str) -> dict[str, list[float]]:
    """Each job's instructions a step, block by block. Part 1 runs to the first block's first
    mark; part 2k is the k-th block's timed steps, part 2k+1 the untimed steps before the next."""
    told = json.loads(Path(folder, "labels.json").read_text())
    counted = parts(folder)
    blocks: dict[str, list[float]] = {}
    for index, label in enumerate(told["labels"]):
        blocks.setdefault(label, []).append(counted[2 * (index + 1)] / told["steps"])
    return blocks


def report(blocks: dict[str, list[float]], say: Callable[[str], None] = print) -> None:
    """Each job's instructions a step beside the plain job's, and ddptop's beside the floor's."""
    plain = statistics.median(blocks["plain"])
    say(f"{'instructions a step, training thread':<38}{'median':>12}{'over plain':>12}{'blocks from':>14}{'to':>12}")
    for name, counts in blocks.items():
        median = statistics.median(counts)
        extra = f"{median - plain:>+12,.0f}" if name != "plain" else f"{'':>12}"
        say(f"{name[:38]:<38}{median:>12,.0f}{extra}{min(counts):>14,.0f}{max(counts):>12,.0f}")
    floors = [name for name in blocks if name not in ("plain", "ddptop")]
    for floor in floors:
        over = statistics.median(blocks[floor]) - plain
        if over > 0:
            ratio = (statistics.median(blocks["ddptop"]) - plain) / over
            say(f"ddptop's instructions over plain / the floor's ({floor}): {ratio:.2f}x")
