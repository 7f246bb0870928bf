"""`ddptop ls [--running] [--json]`: every run of this user, newest last, and how each ended.

What a run's supervisor wrote into meta.json when the job ended (exit
status, steps done, and for a failed run the verdict that explains it) is
read back; a run whose supervisor died before it could say is judged from
its event log's last record (rundir.RunDir.state), and its steps, how
long it ran and its goodput are what a replay shows: the state its
supervisor last saved and the records logged after it, folded
(model/snapshot.py replayed). A running job's steps and goodput so far are
its replay's too, as its dashboard's header shows them: the state its
supervisor saves every 30 s or more would show none for a job's first half
minute, and steps that long behind after it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ddptop.core import rundir, wire
from ddptop.core.format import duration
from ddptop.core.model import snapshot
from ddptop.core.model.job import JobState
from ddptop.core.usage import OneLineParser


def row(run: rundir.RunDir, now: float) -> dict[str, Any]:
    meta = run.read_meta()
    state = run.state()
    started, ended = meta.get("started"), meta.get("ended")
    if ended is None:  # running, or its supervisor died before saying: as the replay shows it
        folded = replay(run)
        if folded is not None:
            if state != "running":
                ended = folded.last_wall
            meta = {**meta, "steps": folded.totals().steps_done, "goodput": folded.goodput.split(ended if ended is not None else now)}
    style = meta.get("launch_style", "torchrun")
    return {
        "id": run.id,
        "script": meta.get("script"),
        "state": state,
        # A self-starting script's ranks are as many as its GPUs (said when they differ); DataParallel is one process.
        "ranks": meta.get("nproc_per_node") if style == "torchrun" else 1 if style == "single" else meta.get("gpus"),
        "launch_style": style,
        "launch_reason": meta.get("launch_reason"),
        "nnodes": meta.get("nnodes"),
        "started": started,
        "ended": ended,
        "duration_s": None
        if started is None
        else round((ended if ended is not None else now if state == "running" else started) - started, 1),
        "steps": meta.get("steps") if meta.get("steps") is not None else snapshot.steps_done(run.snapshot_path),
        "exit_code": meta.get("exit_code"),
        "why": meta.get("why"),
        "goodput": meta.get("goodput"),
        "path": str(run.path),
    }


def replay(run: rundir.RunDir) -> JobState | None:
    """The run's state as its replay folds it; None for a log that cannot be read."""
    state = JobState()
    try:
        records, _ = snapshot.replayed(run.snapshot_path, run.events_path)
        for record in records:
            state.ingest(record)
    except (OSError, wire.FrameError):
        return None
    return state


def list_runs(argv: list[str]) -> int:
    parser = OneLineParser(prog="ddptop ls")
    parser.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    parser.add_argument("--running", action="store_true", help="only the runs still running")
    opts = parser.parse_args(argv)
    now = time.time()
    rows = [r for r in (row(run, now) for run in rundir.all_runs()) if not opts.running or r["state"] == "running"]
    if opts.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no {'running ' if opts.running else ''}runs under {rundir.runs_root()}")
        return 0
    print(f"{'ID':<40} {'STATE':<9} {'RANKS':>5}  {'STARTED':<19} {'TOOK':>8} {'STEPS':>7} {'EXIT':>4} {'GOODPUT':>7}  SCRIPT")
    for r in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"] or 0))
        took = "-" if r["duration_s"] is None else duration(r["duration_s"])
        steps = "-" if r["steps"] is None else str(r["steps"])
        code = "-" if r["exit_code"] is None else str(r["exit_code"])
        good = "-" if r["goodput"] is None else f"{r['goodput']['goodput']:.0%}"
        print(
            f"{r['id']:<40} {r['state']:<9} {r['ranks'] or '?'!s:>5}  {started:<19} {took:>8} {steps:>7} {code:>4} {good:>7}  {r['script']}"
        )
        if r["why"]:
            print(f"{'':<40} why: {r['why']}")
    return 0
