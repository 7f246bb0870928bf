"""How long a dashboard takes to show a long run: attached late to its supervisor, and replayed.

Builds the state a supervisor holds after a day of a 64-rank job: a summary
record every second (each rank's step and comm time in it), the last 100
steps of every rank, an alert an hour and a few restarts. Then:

- live: a real hub on a real socket holds that state; a real dashboard
  (headless, 200x50) attaches and is timed until it shows the last step and
  has drawn its charts;
- replay: the same state saved beside a run's log (as the supervisor saves
  it when the job ends) is replayed, timed the same way;
- a crashed run: --crash-ranks ranks x --crash-steps steps (1.9 M step
  records by default) written through a real hub, which saves its state
  every SNAPSHOT_EVERY_S of the run's time as a supervisor does, and then
  killed: its log flushed, no final snapshot. Replayed, timed the same way;
- the old way, for scale: replaying a log record by record, measured on
  --log-records records and extrapolated to the day's step records.

    python bench/attach.py --ranks 64 --hours 24
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from pathlib import Path

from scratch import scratch_folder, scratch_home

from ddptop.core import rundir
from ddptop.core.eventlog import EventLog
from ddptop.core.model import snapshot
from ddptop.core.model.history import pack
from ddptop.core.model.job import JobState
from ddptop.supervisor.serving.hub import SNAPSHOT_EVERY_S, Hub
from ddptop.tui.app import DdptopApp
from ddptop.tui.source import LiveSource, ReplaySource
from ddptop.tui.widgets.chart import Chart

STEPS_PER_S = 10


def long_run(state: JobState, ranks: int, seconds: int, start: float) -> None:
    """A day's state, built as the supervisor's is: record by record, but summaries for the day."""
    state.ingest({"type": "run", "wall": start, "id": "day", "script": "train.py"})
    for rank in range(ranks):
        hello = {"type": "rank_hello", "rank": rank, "local_rank": rank % 8, "world_size": ranks, "node": rank // 8}
        state.ingest({**hello, "host": f"n{rank // 8}", "pid": 1000 + rank, "restart": 0})
    for second in range(seconds):
        wall = start + second
        if second % 3600 == 1800:
            state.ingest({"type": "alert", "wall": wall, "kind": "straggler", "text": "rank 5 slow", "ranks": [5], "action": "none"})
        if second % 28800 == 14400:
            state.ingest({"type": "group_restart", "wall": wall, "node": 0, "restart": second // 28800 + 1, "remaining": 3})
        steps = [100.0 + (30.0 if r == 5 and second > seconds // 2 else 0.0) for r in range(ranks)]
        metrics = {"samples_per_s": 640.0 * ranks, "loss": 4.0 * math.exp(-second / 7200) + 0.1, "step_ms_p50": 100.0, "comm_ms": 30.0}
        record = {"type": "summary", "wall": wall, "metrics": metrics, "rank_step_ms": pack(steps), "rank_comm_ms": pack([30.0] * ranks)}
        state.ingest({**state.totals().record(wall), **record})
    last = start + seconds
    for n in range(100):
        for rank in range(ranks):
            step = {"type": "step", "rank": rank, "step": seconds * STEPS_PER_S + n, "wall": last + n / STEPS_PER_S}
            state.ingest({**step, "step_ms": 100.0, "comm_ms": 30.0, "samples": 64, "loss": 0.2})


async def shown(app: DdptopApp, pilot: object, last_step: int) -> None:
    """Until the dashboard shows the run's last step and its throughput chart has drawn the day."""
    while not (app.state.ranks and max(r.step for r in app.state.ranks.values()) >= last_step):
        await asyncio.sleep(0.01)
    app.main.draw_plots()
    throughput = app.query_one("#chart-throughput", Chart)
    while throughput.drawing is None or not throughput.drawing.lines:
        await asyncio.sleep(0.01)
    throughput.render()


async def time_live(run: rundir.RunDir, state: JobState, last_step: int) -> tuple[float, float, int]:
    hub = Hub(run, lambda command: None)
    hub.state = state
    await hub.start()
    started = time.perf_counter()
    frames = hub.snapshot_frames()
    built = time.perf_counter() - started
    app = DdptopApp(LiveSource(run.socket_path), "attach", run.path)
    started = time.perf_counter()
    async with app.run_test(size=(200, 50)) as pilot:
        await shown(app, pilot, last_step)
        took = time.perf_counter() - started
    await hub.collector.close()
    return took, built, sum(len(f) for f in frames)


async def time_replay(run: rundir.RunDir, last_step: int) -> float:
    app = DdptopApp(ReplaySource(run), "replay", run.path)
    started = time.perf_counter()
    async with app.run_test(size=(200, 50)) as pilot:
        await shown(app, pilot, last_step)
        return time.perf_counter() - started


def crashed_run(path: Path, ranks: int, steps: int, start: float) -> tuple[rundir.RunDir, int, float, int]:
    """A run written by a real hub at STEPS_PER_S steps a second and killed: every second a
    summary, the periodic snapshot when due (by the run's clock), and at the end a flushed
    log and no final snapshot. (run, its last step, mean seconds a snapshot took, snapshots)."""
    run = rundir.create(Path("train.py"), path)
    now = [start]
    hub = Hub(run, lambda command: None, clock=lambda: now[0])
    hub.record({"type": "run", "wall": start, "id": "crashed", "script": "train.py"})
    for rank in range(ranks):
        hello = {"type": "rank_hello", "rank": rank, "local_rank": rank % 8, "world_size": ranks, "node": rank // 8}
        hub.record({**hello, "host": f"n{rank // 8}", "pid": 1000 + rank, "restart": 0})
    took: list[float] = []
    for step in range(steps):
        now[0] = start + step / STEPS_PER_S
        for rank in range(ranks):
            record = {"type": "step", "rank": rank, "step": step, "wall": now[0], "step_ms": 100.0, "comm_ms": 30.0}
            hub.record({**record, "samples": 64, "loss": 4.0 * math.exp(-step / 20000) + 0.1})
        if step % STEPS_PER_S == STEPS_PER_S - 1:
            hub.record_totals()
            hub.keep_state()
            if hub.snapshot_s is not None:
                took.append(hub.snapshot_s)
                hub.snapshot_s = None
    hub.flush()
    return run, steps - 1, sum(took) / max(1, len(took)), len(took)


async def time_record_by_record(path: Path, ranks: int, records: int) -> float:
    """Records a second a dashboard folds when it reads a log record by record."""
    run = rundir.create(Path("train.py"), path)
    log = EventLog(run.events_path)
    log.append({"type": "run", "wall": 0.0, "id": "log", "script": "train.py"})
    for n in range(records):
        log.append(
            {"type": "step", "rank": n % ranks, "step": n // ranks, "wall": n / 1000.0, "step_ms": 100.0, "comm_ms": 30.0, "samples": 64}
        )
    log.close()
    source = ReplaySource(run)
    state = JobState()
    started = time.perf_counter()
    async for record in source.records():
        state.ingest(record)
    return records / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--log-records", type=int, default=300_000)
    parser.add_argument("--crash-ranks", type=int, default=64)
    parser.add_argument("--crash-steps", type=int, default=30_000)
    args = parser.parse_args()
    seconds = int(args.hours * 3600)
    base = Path(scratch_folder("ddptop-bench-attach-"))
    scratch_home()

    started = time.perf_counter()
    state = JobState()
    long_run(state, args.ranks, seconds, time.time() - seconds - 10)
    print(f"a {args.hours:g} h run of {args.ranks} ranks: state built in {time.perf_counter() - started:.1f} s")
    last_step = seconds * STEPS_PER_S + 99

    live = rundir.create(Path("train.py"), base / "live")
    took, built, size = asyncio.run(time_live(live, state, last_step))
    print(f"attach (live):  shown in {took:.2f} s  (snapshot: {built * 1000:.0f} ms to build, {size / 1e6:.1f} MB)")

    replayed = rundir.create(Path("train.py"), base / "replay")
    log = EventLog(replayed.events_path)
    log.append({"type": "notice", "wall": time.time(), "text": "the log's records are in the saved state"})
    log.close()
    snapshot.save(replayed.snapshot_path, state, log.position())
    print(f"replay:         shown in {asyncio.run(time_replay(replayed, last_step)):.2f} s")

    started = time.perf_counter()
    crashed, crash_last, snapshot_s, snapshots = crashed_run(base / "crashed", args.crash_ranks, args.crash_steps, time.time() - 3600)
    records = args.crash_ranks * args.crash_steps
    print(
        f"a crashed run of {args.crash_ranks} ranks x {args.crash_steps:,} steps ({records / 1e6:.1f} M step records) written "
        f"through a hub in {time.perf_counter() - started:.0f} s; {snapshots} periodic snapshots (every {SNAPSHOT_EVERY_S:.0f} s "
        f"of the run), {snapshot_s * 1000:.0f} ms each on average; no final one"
    )
    print(f"replay of the crashed run: shown in {asyncio.run(time_replay(crashed, crash_last)):.2f} s")

    rate = asyncio.run(time_record_by_record(base / "log", args.ranks, args.log_records))
    day_records = seconds * STEPS_PER_S * args.ranks
    print(
        f"record by record (before): {rate:,.0f} records/s, so the run's {day_records / 1e6:.0f} M step records "
        f"would take {day_records / rate / 60:.0f} min"
    )


if __name__ == "__main__":
    main()
