"""`ddptop profile [RUN] [--rank R | --ranks 0,3 | --all] [--steps N]`: why a rank is slow, from a capture of it.

Connects to the run's supervisor as `ddptop stop` does, asks for a
torch.profiler capture of the next N steps of the chosen ranks, and waits:
a line when the capture starts, a line as each rank's trace arrives, then
the summary (model/profiles.py): each rank's step split into phases and
its top ops, and what differs from the median rank. A capture refused (one
under way, a rank that is not running, N out of range) is one line and
exit 2; so is a run that is not running.
"""

from __future__ import annotations

import argparse
import time
from typing import cast

from ddptop.control import open_connection, parser_for, rank_options
from ddptop.core import wire
from ddptop.core.model import profiles
from ddptop.core.rundir import RunDirError
from ddptop.core.wire.stream import socket_frames
from ddptop.trainer.profiling import MAX_S, MAX_STEPS

WAIT_S = MAX_S + 180.0
"""The capture's own bound, then the ranks' traces being written, then some."""


def _steps(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_STEPS:
        raise argparse.ArgumentTypeError(f"{text}: from 1 to {MAX_STEPS}")
    return value


def profile(argv: list[str]) -> int:
    parser = parser_for("ddptop profile", "profile")
    rank_options(
        parser, "the rank to capture (default: every rank)", "ranks to capture in the same steps, as 0,3: what differs between them is said"
    )
    parser.add_argument(
        "--steps", type=_steps, default=10, help=f"steps to capture, from the next one on (default 10, at most {MAX_STEPS})"
    )
    opts = parser.parse_args(argv)
    job = open_connection(opts.run, opts.token_file, "profile")
    job.send("profile", opts.rank, opts.ranks, steps=opts.steps)
    capture = wait(job.sock, job.name)
    lines = profiles.summary_lines(capture)
    print("\n".join(lines) if lines else f"ddptop: no rank answered: {capture.text}")
    return 0 if any("path" in result for result in capture.results.values()) else 1


def wait(sock: object, name: str) -> profiles.Capture:
    """The capture asked for, once every rank has answered (or the job ended first)."""
    captures: dict[str, profiles.Capture] = {}
    ours: str | None = None
    for frame in socket_frames(sock, time.monotonic() + WAIT_S):  # type: ignore[arg-type]
        record = cast(wire.Record, frame)  # the supervisor's own records, as it sends every viewer
        if record["type"] == "capture" and ours in (None, record["id"]):
            capture = profiles.fold(captures, record)
            if capture.state == "refused":
                raise RunDirError(f"run {name}: {capture.text}")
            ours = capture.id
            print(f"ddptop: {capture.text}", flush=True)
            if capture.state == "done":
                return capture
        elif record["type"] == "profile" and record["id"] == ours:
            profiles.fold(captures, record)
            told = f"trace {record['path']}" if "path" in record else f"no capture: {record.get('error')}"
            print(f"ddptop: rank {record['rank']}: {told}", flush=True)
        elif record["type"] == "exit":
            break
    if ours is None:
        raise RunDirError(f"run {name}: its supervisor said nothing of the capture (it ended, or it is another version of ddptop)")
    capture = captures[ours]
    capture.text = capture.text or "the job ended before the capture was done"
    return capture
