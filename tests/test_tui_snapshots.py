"""Snapshots of the main, detail and help screens over a fixed, replayed run.

The run is written record by record with fixed times and values, and
replayed (the dashboard's clock is the log's in replay), so each snapshot
is the same on every machine.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from conftest import until

from ddptop.core import rundir
from ddptop.core.eventlog import EventLog
from ddptop.core.model.job import JobState
from ddptop.tui.app import DdptopApp
from ddptop.tui.source import ReplaySource

BASE = 1_800_000_000.0


def fixed_run(path: Path) -> rundir.RunDir:
    run = rundir.create(Path("train.py"), path)
    run.write_meta({"id": "fixed", "script": "train.py", "state": "finished", "started": BASE})
    log, state = EventLog(run.events_path), JobState()

    def record(frame: dict) -> None:
        log.append(frame)
        state.ingest(frame)

    record({"type": "run", "wall": BASE, "script": "/data/train.py", "nnodes": "1"})
    record({"type": "notice", "wall": BASE, "text": "no CUDA GPU found: starting 4 CPU ranks on gloo"})
    for rank in range(4):
        record(
            {
                "type": "rank_hello",
                "rank": rank,
                "local_rank": rank,
                "world_size": 4,
                "node": 0,
                "host": "box",
                "pid": 4000 + rank,
                "restart": 0,
            }
        )
    for step in range(120):
        for rank in range(4):
            slow = 2.0 if rank == 3 else 1.0
            record(
                {
                    "type": "step",
                    "rank": rank,
                    "step": step,
                    "wall": BASE + step * 0.05 * slow,
                    "step_ms": 50.0 * slow + rank,
                    "data_ms": 0.5,
                    "samples": 32,
                    "total_steps": 200,
                    "loss": 2.0 * math.exp(-step / 40) + 0.05 * rank,
                    "grad_norm": 1.0 + 0.01 * rank,
                    "comm_ms": 12.0 + rank,
                    "comm_bytes": 340_000,
                }
            )
        if step % 20 == 19:
            record(
                {
                    "type": "sample",
                    "wall": BASE + step * 0.05,
                    "gpus": [],
                    "procs": [{"rank": r, "pid": 4000 + r, "cpu": 95.0, "rss": 300 << 20} for r in range(4)],
                }
            )
            record(state.summary(BASE + step * 0.05))
    stack = ["train.py:60 in <module>", "train.py:51 in train_step", "torch/_tensor.py:626 in backward"]
    for rank in range(4):
        beat = {"type": "heartbeat", "rank": rank, "wall": BASE + 6, "phase": "comm", "step": 120, "dropped": 0}
        record({**beat, "where": "train.py:51 in train_step", "stack": stack, "forwards": 120})
    record({"type": "alert", "wall": BASE + 6, "rank": 3, "step": 119, "text": "straggler: 2.0x the median step time"})
    record({"type": "exit", "wall": BASE + 12, "code": 0, "stopped_by_signal": None})
    log.close()
    return run


@pytest.fixture
def replay_app(tmp_path, ddptop_home, monkeypatch) -> DdptopApp:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    run = fixed_run(tmp_path / "run")
    return DdptopApp(ReplaySource(run), "replay", run.path)


async def replayed(pilot) -> None:
    await until(lambda: pilot.app.stream_ended, "the whole run replayed")
    pilot.app.refresh_plots(force=True)
    await pilot.pause()  # until the app is idle: the plots redrawn


def test_main_screen(snap_compare, replay_app):
    assert snap_compare(replay_app, terminal_size=(140, 30), run_before=replayed)


def test_detail_screen(snap_compare, replay_app):
    assert snap_compare(replay_app, terminal_size=(140, 30), run_before=replayed, press=["down", "down", "down", "enter"])


def test_help_screen(snap_compare, replay_app):
    assert snap_compare(replay_app, terminal_size=(100, 30), run_before=replayed, press=["question_mark"])
