"""The dashboard under load: keypress latency and CPU with many ranks streaming.

A child process runs a real hub (the supervisor's serving half) fed by N
synthetic ranks at R steps/s each over the real wire; this process runs the
real dashboard attached to it (headless, driven by Pilot), presses keys
while the stream flows, and reports how long each key took to take effect
and how much CPU this process used.

    python bench/dashboard.py --ranks 64 --rate 10 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from scratch import scratch_folder, scratch_home
from synthetic import synthetic_job

from ddptop.core import rundir
from ddptop.supervisor.serving.hub import Hub
from ddptop.tui.app import DdptopApp
from ddptop.tui.source import LiveSource


def serve(run_path: str, ranks: int, rate: float, seconds: float) -> None:
    """The child: a hub with synthetic ranks, for seconds."""

    async def main() -> None:
        run = rundir.RunDir(Path(run_path))
        hub = Hub(run, lambda command: None)
        await hub.start()
        hub.record({"type": "run", "wall": time.time(), "script": "synthetic.py", "nnodes": str(max(1, ranks // 8))})
        job = asyncio.create_task(synthetic_job(run.socket_path, ranks, rate))

        async def totals() -> None:
            while True:
                await asyncio.sleep(1.0)
                hub.record_totals()

        ticker = asyncio.create_task(totals())
        await asyncio.sleep(seconds)
        job.cancel()
        ticker.cancel()
        await asyncio.gather(job, ticker, return_exceptions=True)
        await hub.finish(0)

    asyncio.run(main())


async def measure(run: rundir.RunDir, ranks: int, seconds: float) -> dict:
    app = DdptopApp(LiveSource(run.socket_path), "attach", run.path)
    latencies: list[float] = []
    me = psutil.Process()
    async with app.run_test(size=(200, 50)) as pilot:
        while len(app.state.ranks) < ranks:
            await pilot.pause(0.1)
        await pilot.pause(0.5)  # a tick to choose the view
        cpu_start, wall_start, records_start = me.cpu_times(), time.monotonic(), app.state.records
        step = 1
        while time.monotonic() - wall_start < seconds:
            # Delivered as the terminal driver delivers a key; timed until what
            # it asks for has been applied: the next sort in the rank table, or
            # the cursor's move in the node rollup that a large job opens in.
            # (Pilot.press would also wait for the whole app to go idle, which
            # a live stream never allows.)
            probe: Callable[[], object]
            if app.main.showing_nodes():
                if app.main.nodes.selected_node() == (app.main.nodes.row_count - 1 if step > 0 else 0):
                    step = -step  # bounce between the first and the last node
                key, probe = ("down" if step > 0 else "up"), app.main.nodes.selected_node
            else:
                key, probe = "s", lambda: app.main.table.sort_key
            before = probe()
            start = time.perf_counter()
            app.simulate_key(key)
            while probe() == before:
                await asyncio.sleep(0.001)
            latencies.append((time.perf_counter() - start) * 1000.0)
            await asyncio.sleep(0.5)
        cpu_end, wall = me.cpu_times(), time.monotonic() - wall_start
        records = app.state.records - records_start
        view = "node rollup, cursor keys" if app.main.showing_nodes() else "rank table, sort key"
    used = (cpu_end.user - cpu_start.user) + (cpu_end.system - cpu_start.system)
    return {
        "latencies": latencies,
        "cpu_share": used / wall,
        "records_per_s": records / wall,
        "view": view,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--rate", type=float, default=10.0, help="steps per second per rank")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    args = parser.parse_args()
    scratch_home()

    run = rundir.create(Path("synthetic.py"), Path(scratch_folder("ddptop-bench-")) / "run")
    child = multiprocessing.get_context("spawn").Process(target=serve, args=(str(run.path), args.ranks, args.rate, args.seconds + 30))
    child.start()
    while not run.socket_path.exists():
        time.sleep(0.05)
    result = asyncio.run(measure(run, args.ranks, args.seconds))
    child.terminate()
    child.join()
    lat = sorted(result["latencies"])
    print(
        f"dashboard, {args.ranks} synthetic ranks at {args.rate:g} steps/s, {args.seconds:g} s measured, 200x50 headless, {result['view']}"
    )
    print(f"records ingested:      {result['records_per_s']:,.0f}/s")
    p95 = lat[max(0, round(0.95 * len(lat)) - 1)]
    print(f"keypress to effect:    p50 {statistics.median(lat):.1f} ms, p95 {p95:.1f} ms, max {lat[-1]:.1f} ms over {len(lat)} presses")
    print(f"dashboard CPU:         {result['cpu_share']:.0%} of one core")


if __name__ == "__main__":
    main()
