"""Where a rank of a job ddptop did not launch is, read from outside by py-spy, and what that says.

py-spy reads a process's memory in non-blocking mode (`--nonblocking`): the
rank is never paused, and nothing is written into it. Its main thread's
frames give WHERE (the innermost frame of the script's own code) and whether
it is inside a torch.distributed collective. From the ranks' places and
their processes' states come the verdicts a person needs first: a rank
stopped, in uninterruptible I/O, a zombie, gone while the others run, and
the odd rank out (one rank elsewhere while the others wait in a collective).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from ddptop.core.places import is_script, place
from ddptop.supervisor.outside.discovery import Job
from ddptop.supervisor.watching.stacks import PY_SPY_TIMEOUT_S, py_spy
from ddptop.supervisor.watching.verdict import ranks_text

_FRAME = re.compile(r"^\s+(?P<function>.+) \((?P<path>.+):(?P<line>\d+)\)$")
_THREAD = re.compile(r"^Thread \S+ \((?P<state>[^)]*)\): \"(?P<name>[^\"]*)\"")

LOOKS_AT_ONCE = 8
"""Ranks py-spy reads at once: a look at 64 ranks takes a few of py-spy's reads, not 64."""

COLLECTIVES_FILE = "torch/distributed/distributed_c10d.py"
"""Where torch.distributed's collectives are defined: a frame there is a rank inside one."""

STATE_WORDS = {
    "stopped": "stopped (state T: SIGSTOP, or a debugger)",
    "tracing-stop": "stopped by a tracer",
    "disk-sleep": "in uninterruptible I/O (state D)",
    "zombie": "a zombie: exited, not reaped",
    "dead": "gone",
}
"""What a rank's process state says, where it says something (psutil's names)."""


@dataclass(frozen=True)
class Place:
    """Where a rank's main thread is."""

    where: str | None
    """The innermost frame of the script's own code, "train.py:51 in train_step"; None where only
    library code runs."""
    inside: str | None
    """The torch.distributed collective it is in ("all_reduce"), if any."""
    stack: tuple[str, ...]
    """Its frames, innermost first, as py-spy printed them."""


def dump(pid: int, native: bool = False) -> str | None:
    """py-spy's dump of every thread of the process, never pausing it; None where it cannot read one
    (no py-spy, the process gone, ptrace refused)."""
    spy = py_spy()
    if spy is None:
        return None
    command = [spy, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid), *(["--native"] if native else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and "Thread " in done.stdout else None


def place_of(text: str) -> Place:
    """The main thread's place in a py-spy dump (its first thread where none is named MainThread)."""
    frames: list[tuple[str, str, str]] = []
    current: list[tuple[str, str, str]] | None = None
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread is not None:
            if current is not None and frames:
                break
            current = frames if thread["name"] == "MainThread" or not frames else None
            continue
        frame = _FRAME.match(line)
        if frame is not None and current is not None:
            current.append((frame["function"], frame["path"], frame["line"]))
    where = next((place(path, line, function) for function, path, line in frames if is_script(path)), None)
    inside = next((function for function, path, _ in frames if path.endswith(COLLECTIVES_FILE)), None)
    return Place(where, inside, tuple(f"{function} ({path}:{line})" for function, path, line in frames))


Read = TypeVar("Read")


def each(read: Callable[[int], Read], pids: Iterable[int]) -> dict[int, Read]:
    """read(pid) of every pid, LOOKS_AT_ONCE at a time (each is a py-spy process), by pid."""
    pids = list(pids)
    with ThreadPoolExecutor(max_workers=LOOKS_AT_ONCE) as pool:
        return dict(zip(pids, pool.map(read, pids)))


def look(pid: int) -> Place | None:
    text = dump(pid)
    return None if text is None else place_of(text)


def verdicts(job: Job, places: dict[int, Place | None]) -> list[str]:
    """What one look at a job says is wrong, each with its evidence. places: each rank's, by pid."""
    said = [f"rank {r.rank} (pid {r.pid}) is {STATE_WORDS[r.status]}" for r in job.ranks if r.status in STATE_WORDS]
    local = job.local_world_size
    if local is not None and len(job.ranks) < local and all(r.local_rank is not None for r in job.ranks):
        present = {r.local_rank for r in job.ranks}
        missing = [n for n in range(local) if n not in present]
        said.append(f"local {ranks_text(missing)} of this node gone while the others run")
    known = {r.rank: place for r in job.ranks if (place := places.get(r.pid)) is not None}
    split = odd_out({rank: p.inside for rank, p in known.items()})
    if split is not None:
        waiting, odd = split
        inside = known[waiting[0]]
        for rank in odd:
            said.append(
                f"rank {rank} at {known[rank].where or 'library code'}; {ranks_text(waiting)} in {inside.inside}"
                + (f" at {inside.where}" if inside.where else "")
            )
    return said


def odd_out(inside: dict[int, str | None]) -> tuple[list[int], list[int]] | None:
    """The odd ranks out, from what collective each rank is in (None: none): at least two ranks
    inside one, and fewer outside. (those inside, those outside), each in rank order; None where
    the ranks do not split so."""
    waiting = sorted(rank for rank, collective in inside.items() if collective is not None)
    odd = sorted(rank for rank, collective in inside.items() if collective is None)
    return (waiting, odd) if len(waiting) >= 2 and odd and len(odd) < len(waiting) else None
