"""Snapshots of the main screen (200x50, 80x24, 64 ranks' heatmap), the detail
and help screens over a fixed, replayed run.

The run is written record by record with fixed times and values, and
replayed (the dashboard's clock is the log's in replay), so each snapshot
is the same on every machine.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from builders import hello
from support import until

from ddptop.core import rundir
from ddptop.core.eventlog import EventLog
from ddptop.core.model.job import JobState
from ddptop.tui.app import DdptopApp
from ddptop.tui.screens.main import MainScreen
from ddptop.tui.source import ReplaySource

BASE = 1_800_000_000.0


def fixed_run(path: Path, ranks: int = 4, seconds: int = 300, compute: bool = True) -> rundir.RunDir:
    """A run of `seconds` at a step a second: the loss falls over two decades, the last rank
    turns straggler half way (its own work up, the others' wait for it up), an alert and a
    restart are on the time axis. Without `compute` no rank reports DDP's compute time, as
    before DDP has timed it: own work is then the data wait alone, the straggler's the
    longest."""
    run = rundir.create(Path("train.py"), path)
    run.write_meta({"id": "fixed", "script": "train.py", "state": "finished", "started": BASE})
    log, state = EventLog(run.events_path), JobState()

    def record(frame: dict) -> None:
        log.append(frame)
        state.ingest(frame)

    record({"type": "run", "wall": BASE, "id": "fixed", "script": "/data/train.py", "nnodes": "1"})
    record({"type": "notice", "wall": BASE, "text": "no CUDA GPU found: starting 4 CPU ranks on gloo"})
    for rank in range(ranks):
        record(hello(rank, ranks, local_rank=rank % 8, node=rank // 8, host="box", pid=4000 + rank))
    for step in range(seconds):
        wall = BASE + step
        straggling = step >= seconds // 2
        for rank in range(ranks):
            own = 70.0 if straggling and rank == ranks - 1 else 40.0 + rank % 3
            step_ms = 100.0 if straggling else 72.0
            loss = 4.0 * math.exp(-step / 60) + 0.02 + 0.001 * rank
            data_ms = 0.5 if compute else own / 10
            step_record = {
                "type": "step",
                "rank": rank,
                "step": step,
                "wall": wall,
                "step_ms": step_ms,
                "data_ms": data_ms,
                "samples": 32,
                "total_steps": 400,
                "loss": loss,
                "grad_norm": 1.0 + 0.01 * rank,
                "comm_ms": step_ms - own,
                "comm_bytes": 340_000,
            }
            if compute:
                step_record["compute_ms"] = own - data_ms  # own work: the data wait and DDP's compute
            record(step_record)
        if step % 20 == 19:
            procs = [{"rank": r, "pid": 4000 + r, "cpu": 95.0, "rss": (300 << 20) + step * (1 << 16)} for r in range(ranks)]
            record({"type": "sample", "wall": wall, "gpus": [], "procs": procs})
        if step == seconds // 3:
            record({"type": "alert", "wall": wall, "kind": "nan", "rank": 1, "step": step, "text": "NaN loss at rank 1; step skipped"})
        record(state.summary(wall))
    stack = ["train.py:60 in <module>", "train.py:51 in train_step", "torch/_tensor.py:626 in backward"]
    for rank in range(ranks):
        beat = {"type": "heartbeat", "rank": rank, "wall": BASE + seconds, "phase": "comm", "step": seconds, "dropped": 0}
        record({**beat, "where": "train.py:51 in train_step", "stack": stack, "forwards": seconds})
    straggler = ranks - 1
    record({"type": "alert", "wall": BASE + seconds, "kind": "straggler", "rank": straggler, "text": f"straggler: rank {straggler}"})
    record({"type": "exit", "wall": BASE + seconds + 2, "code": 0, "stopped_by_signal": None})
    log.close()
    return run


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def paused_replay(run: rundir.RunDir) -> DdptopApp:
    """Paused until the whole run is in: a table widens its columns for the longest text it has
    shown, and what a tick shows mid-replay depends on the machine's speed."""
    app = DdptopApp(ReplaySource(run), "replay", run.path)
    app.main.set_reactive(MainScreen.paused, True)  # before it is mounted: no watcher to run yet
    return app


@pytest.fixture
def replay_app(tmp_path, ddptop_home, utc) -> DdptopApp:
    return paused_replay(fixed_run(tmp_path / "run"))


@pytest.fixture
def replay_64(tmp_path, ddptop_home, utc) -> DdptopApp:
    return paused_replay(fixed_run(tmp_path / "run64", ranks=64, seconds=120))


async def replayed(pilot) -> None:
    await until(lambda: pilot.app.stream_ended, "the whole run replayed")
    pilot.app.main.paused = False
    pilot.app.main.redraw()  # the layout for the whole run's ranks, whatever the ticks did
    await pilot.pause()
    pilot.app.main.draw_plots()
    await pilot.pause()  # until the app is idle: the charts redrawn at their final size


class TestMainScreen:
    """The rank table, the header, the charts and the alerts, at a wide and at a small terminal."""

    def test_wide(self, snap_compare, replay_app):
        assert snap_compare(replay_app, terminal_size=(200, 50), run_before=replayed)

    def test_small(self, snap_compare, replay_app):
        assert snap_compare(replay_app, terminal_size=(80, 24), run_before=replayed)


class TestManyRanks:
    """Past eight ranks the ranks' chart is a heatmap."""

    @pytest.mark.slow  # a replayed run brought to its end first: seconds
    def test_heatmap_at_64_ranks(self, snap_compare, replay_64):
        assert snap_compare(replay_64, terminal_size=(200, 50), run_before=replayed)


class TestScreens:
    """The screens the main screen opens: a rank's detail, the help."""

    def test_rank_detail(self, snap_compare, replay_app):
        assert snap_compare(replay_app, terminal_size=(140, 30), run_before=replayed, press=["down", "down", "down", "enter"])

    @pytest.mark.slow  # a replayed run brought to its end first: seconds
    def test_help(self, snap_compare, replay_app):
        assert snap_compare(replay_app, terminal_size=(100, 30), run_before=replayed, press=["question_mark"])
