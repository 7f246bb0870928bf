"""`ddptop logs RUN [--rank R] [--attempt N | --all] [-f]`: the ranks' output, as torchrun kept it.

torchrun writes each attempt of each local rank to its own files,
`logs/<id>/attempt_N/<local rank>/{stdout,stderr}.log`. This puts them back
together: attempts in order, each rank's lines tagged when there are several
(`[rank1]`, `[rank1 stderr]`), and with -f it follows the files as they grow
and the attempts a restart adds, until the job ends. The files hold no
times, so within an attempt a rank's stdout comes before its stderr; when
following, lines come in the order they are written.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ddptop.core import rundir
from ddptop.core.rundir import RunDirError
from ddptop.core.usage import OneLineParser

FOLLOW_S = 0.25
STREAMS = ("stdout", "stderr")
_ATTEMPT = re.compile(r"attempt_(\d+)$")


@dataclass(frozen=True)
class LogFile:
    attempt: int
    local_rank: int
    stream: str
    path: Path


def log_files(run: rundir.RunDir) -> list[LogFile]:
    """Every rank log of the run on this node, in attempt, rank, stream order."""
    found = []
    for attempt_dir in run.logs_path.glob("*/attempt_*"):
        attempt = _ATTEMPT.search(attempt_dir.name)
        if attempt is None:
            continue
        for rank_dir in attempt_dir.iterdir():
            if rank_dir.name.isdigit():
                found += [
                    LogFile(int(attempt[1]), int(rank_dir.name), s, rank_dir / f"{s}.log")
                    for s in STREAMS
                    if (rank_dir / f"{s}.log").exists()
                ]
    return sorted(found, key=lambda f: (f.attempt, f.local_rank, STREAMS.index(f.stream)))


def first_rank_here(meta: dict) -> int:
    """The job rank of this node's local rank 0 (a self-starting script's worker holds every rank: 0)."""
    if meta.get("launch_style", "torchrun") != "torchrun":
        return 0
    return int(meta.get("node_rank") or 0) * int(meta.get("nproc_per_node") or 1)


def local_rank_of(meta: dict, rank: int) -> int:
    """This node's local rank of a job rank: the ranks of a node are consecutive, as torchrun
    assigns them; a script that starts its own ranks writes all their output to its one worker's files."""
    if meta.get("launch_style", "torchrun") != "torchrun":
        return 0
    per_node, node = int(meta.get("nproc_per_node") or 1), int(meta.get("node_rank") or 0)
    local = rank - first_rank_here(meta)
    if not 0 <= local < per_node:
        raise RunDirError(f"rank {rank} does not run on this node (node {node} runs ranks {node * per_node}-{(node + 1) * per_node - 1})")
    return local


class Printer:
    def __init__(self, out: TextIO, tag_ranks: bool, tag_attempts: bool) -> None:
        self.out, self.tag_ranks, self.tag_attempts = out, tag_ranks, tag_attempts
        self._attempt: int | None = None

    def tag(self, log: LogFile, rank: int) -> str:
        parts = ([f"rank{rank}"] if self.tag_ranks else []) + (["stderr"] if log.stream == "stderr" else [])
        return f"[{' '.join(parts)}] " if parts else ""

    def lines(self, log: LogFile, rank: int, text: str) -> None:
        if self.tag_attempts and log.attempt != self._attempt:
            self._attempt = log.attempt
            self.out.write(f"==> attempt {log.attempt} <==\n")
        tag = self.tag(log, rank)  # whole lines (text ends one), each as a terminal leaves it: a progress bar's last redraw
        self.out.write("".join(f"{tag}{rundir.shown_line(line)}\n" for line in text.split("\n")[:-1]))
        self.out.flush()


def logs(argv: list[str]) -> int:
    parser = OneLineParser(prog="ddptop logs")
    parser.add_argument("run", nargs="?", help="run directory, run id or id prefix (default: your newest run)")
    parser.add_argument("--rank", type=int, help="one rank's output (default: every rank of this node, tagged)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--attempt", type=int, help="one attempt (0 is the first; default: the latest)")
    which.add_argument("--all", action="store_true", help="every attempt, in order")
    parser.add_argument("-f", "--follow", action="store_true", help="follow a running job's output across restarts until it ends")
    opts = parser.parse_args(argv)
    run = rundir.find(opts.run)
    meta = run.read_meta()
    base = first_rank_here(meta)
    local = None if opts.rank is None else local_rank_of(meta, opts.rank)
    files = [f for f in log_files(run) if local is None or f.local_rank == local]
    if not files and not (opts.follow and run.state() == "running"):
        raise RunDirError(f"run {run.id} has no rank logs" + ("" if local is None else f" of rank {opts.rank}") + f" under {run.logs_path}")
    attempts = sorted({f.attempt for f in files})
    if opts.attempt is not None and opts.attempt not in attempts:
        raise RunDirError(f"run {run.id} has no attempt {opts.attempt} (attempts: {', '.join(map(str, attempts))})")
    first = opts.attempt if opts.attempt is not None else (0 if opts.all else (attempts[-1] if attempts else 0))
    shown = [f for f in files if f.attempt == first or (opts.all and f.attempt >= first)]
    printer = Printer(sys.stdout, tag_ranks=local is None, tag_attempts=opts.all or opts.follow)
    offsets: dict[Path, int] = {}
    for log in shown:
        offsets[log.path] = _print_new(printer, log, base + log.local_rank, 0, rest=not opts.follow)
    if opts.follow:
        _follow(run, printer, offsets, local, base, first)
    elif not any(offsets.values()):  # silence would read as a command that failed to find them
        who = "the ranks" if local is None else f"rank {opts.rank}"
        print(f"ddptop: {who} wrote nothing in {'any attempt' if opts.all else f'attempt {first}'}", file=sys.stderr)
    return 0


def _print_new(printer: Printer, log: LogFile, rank: int, offset: int, rest: bool) -> int:
    """Print the whole lines written past offset, and with rest what follows the last of them (a
    line the rank has not ended: a progress bar's redraw, the last words of a rank that died);
    return the offset after what was printed. Following a running job, that waits for its end."""
    with log.path.open("rb") as stream:
        stream.seek(offset)
        data = stream.read()
    end = len(data) if rest else data.rfind(b"\n") + 1
    if end:
        text = data[:end].decode(errors="replace")
        printer.lines(log, rank, text if text.endswith("\n") else f"{text}\n")
    return offset + end


def _follow(run: rundir.RunDir, printer: Printer, offsets: dict[Path, int], local: int | None, base: int, first: int) -> None:
    """New lines and new attempts' files as they come, until the run is no longer running."""
    while True:
        running = run.state() == "running"
        for log in log_files(run):
            if log.attempt >= first and (local is None or log.local_rank == local):
                offsets[log.path] = _print_new(printer, log, base + log.local_rank, offsets.get(log.path, 0), rest=not running)
        if not running:
            return
        time.sleep(FOLLOW_S)
