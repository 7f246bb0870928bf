"""`ddptop stacks [RUN] [--rank R | --ranks 0,3 | --all]`: where each rank is, now.

What a stall's alert takes, asked for at any time, as torch.distributed's debug
server and Ray's dashboard give it: every thread of each rank with its native
frames (py-spy, which holds the rank still while it reads; faulthandler where
py-spy cannot), read on the rank's own node and kept in the run's stacks/.
Connects to the run's supervisor as `ddptop profile` does, with the job's state
first, which says how many ranks it has; then prints each rank's dump as it
arrives, ranks in the order they answer. A rank nobody could read is named with
the reason, and the exit status is then 1.
"""

from __future__ import annotations

import time

import psutil

from ddptop.control import Connection, open_connection, parser_for, rank_options
from ddptop.core import wire
from ddptop.core.rundir import RunDirError
from ddptop.core.stack_groups import grouped, ranks_span
from ddptop.core.usage import UsageError
from ddptop.core.wire import records
from ddptop.supervisor.watching.stacks import DUMP_WAIT_S, PY_SPY_TIMEOUT_S

WAIT_S = 2 * PY_SPY_TIMEOUT_S + DUMP_WAIT_S + 15.0
"""py-spy with native frames, then without, then faulthandler, on the rank's node, and the way back."""
STATE_WAIT_S = 5.0
"""For the job's state, which the supervisor sends first; a live frame follows within a second."""


def stacks(argv: list[str]) -> int:
    parser = parser_for("ddptop stacks", "dump the stacks of (or the PID of a rank or launcher of any PyTorch job on this host)")
    rank_options(parser, "the rank to dump (default: every rank)", "ranks to dump, as 0,3")
    opts = parser.parse_args(argv)
    if opts.run is not None and opts.run.isdigit() and psutil.pid_exists(int(opts.run)):
        return outside(int(opts.run), opts.rank, opts.ranks)
    job = open_connection(opts.run, opts.token_file, "dump the stacks of", snapshot=True)
    return dump(job, opts.rank, opts.ranks)


def outside(pid: int, rank: int | None = None, ranks: list[int] | None = None) -> int:
    """`ddptop stacks PID` of a job ddptop may not have launched: every rank's threads, read by py-spy
    without pausing it, identical stacks printed once with their ranks and the odd ones apart."""
    from ddptop.supervisor.outside import looks
    from ddptop.supervisor.outside.discovery import discover

    jobs = [job for job in discover().jobs if job.id == pid or any(r.pid == pid for r in job.ranks)]
    if not jobs:
        raise UsageError(f"pid {pid} is no rank or launcher of a PyTorch distributed job on this host (ddptop ps lists them)")
    job = jobs[0]
    asked = [rank] if rank is not None else ranks
    chosen = [r for r in job.ranks if asked is None or r.rank in asked]
    if not chosen:
        raise UsageError(
            f"job {job.id} has no rank {','.join(map(str, asked or []))} (its ranks: {','.join(str(r.rank) for r in job.ranks)})"
        )
    read = looks.each(looks.dump, (r.pid for r in chosen))
    dumps = {r.rank: read[r.pid] for r in chosen}
    print(f"job {job.id} ({job.launcher}), {ranks_span([r.rank for r in chosen])}:")
    for group, text in grouped(dumps):
        print(f"\n{ranks_span(group)}:\n{text}")
    return 1 if any(text is None for text in dumps.values()) else 0


def dump(job: Connection, rank: int | None = None, ranks: list[int] | None = None) -> int:
    """Ask for the ranks' stacks (every rank's by default) and print them as they come."""
    world, exited = _job_ranks(job)
    asked = [rank] if rank is not None else ranks or list(range(world))
    if unknown := [r for r in asked if not 0 <= r < world]:
        raise RunDirError(f"run {job.name} has ranks 0-{world - 1}: no rank {','.join(map(str, unknown))}")
    if gone := [r for r in asked if r in exited]:  # no process to read: said now, not after the wait
        print(f"ddptop: rank {','.join(map(str, gone))} has exited: no stacks to dump")
    live = [r for r in asked if r not in exited]
    if live:
        job.send("stacks", ranks=live)
    return max(_print_dumps(job, set(live)), 1 if gone else 0)


def _job_ranks(job: Connection) -> tuple[int, set[int]]:
    """The job's world size and the ranks whose process has ended, from its state's first
    frames: the job's, then its ranks' (model/snapshot.py), up to the first frame after them."""
    world, exited = 0, set[int]()

    def read(record: wire.Frame) -> bool:
        nonlocal world
        if record["type"] == "snapshot":
            world = int(record["job"].get("world_size") or 0)
        elif record["type"] == "snapshot_ranks":
            exited.update(r["rank"] for r in record["ranks"] if r.get("exited"))
        return record["type"] not in ("snapshot", "snapshot_ranks")

    job.until(read, STATE_WAIT_S)
    if world < 1:
        raise RunDirError(f"run {job.name}: no rank has started yet, so none has a stack to dump")
    return world, exited


def _print_dumps(job: Connection, waiting: set[int]) -> int:
    """Each rank's dump or why there is none, as they come; 1 if any rank had none."""
    failed = False
    deadline = time.monotonic() + WAIT_S
    while waiting:
        record = job.until(lambda r: r.get("rank") in waiting and _answers(r), deadline - time.monotonic())
        if record is None:
            break
        rank = record["rank"]
        waiting.discard(rank)
        if record["type"] == "stack":
            print(f"==> rank {rank} ({record['source']}) <==\n{record['text'].rstrip()}\n", flush=True)
        else:
            failed = True
            print(f"ddptop: {record['text']}", flush=True)
    if waiting:
        print(f"ddptop: no answer from rank {','.join(map(str, sorted(waiting)))} within {WAIT_S:.0f} s (it exited, or its node is gone)")
    return 1 if failed or waiting else 0


def _answers(record: wire.Frame) -> bool:
    """A record that answers for a rank: its stacks, or the supervisor's word that it has none."""
    return record["type"] == "stack" or (record["type"] == "action" and record.get("kind") == records.NO_STACKS)
