"""How the supervisor's costs grow with the number of ranks, without torch.

Three processes, as in a real job:

- the supervisor's serving half in a child: the real hub (collector, event
  log, job state, viewers) with the real watchdog observing every record
  and ticking every 0.25 s, the per-second summary record, the periodic
  state snapshot and the once-a-minute heap trim (supervisor/heap.py), as
  `ddptop launch` runs them;
- N synthetic ranks in another child (bench/synthetic.py: the real wire,
  a batch frame every 100 ms, a heartbeat a second, a parameter checksum
  every 100 steps and, now and then, a NaN step that the watchdog turns into
  an alert);
- this process: a dashboard's connection (the wire client the TUI uses),
  measuring how old each step record is when it arrives, so the latency
  includes the rank's own batching (up to 100 ms) as it would in a job.

    python bench/scale.py --ranks 8 64 256 1024 --rate 10 --seconds 30

Per N it prints the supervisor's CPU (share of one core) and resident
memory at the start and the end of the measured window, records ingested
per second, records dropped (sent by the ranks but not in the supervisor's
state), the latency p50/p99 and the event log's bytes per rank-step.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import statistics
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import psutil
from scratch import scratch_folder, scratch_home
from synthetic import synthetic_job

from ddptop.core import rundir, wire
from ddptop.core.policy import WatchPolicy
from ddptop.core.wire import unixpath
from ddptop.core.wire.stream import frames
from ddptop.supervisor import heap
from ddptop.supervisor.serving.hub import Hub
from ddptop.supervisor.watching.watchdog import Watchdog

WATCH_S = 0.25


def supervise(run_path: str, results: multiprocessing.Queue, stop: Connection) -> None:
    """The child that plays the supervisor until the parent closes the other end of `stop`."""

    async def main() -> None:
        run = rundir.RunDir(Path(run_path))
        verdicts: list = []
        hub = Hub(run, lambda command: None, observer=lambda record: verdicts.extend(watchdog.observe(record)))
        watchdog = Watchdog(WatchPolicy(), hub.state)
        await hub.start()
        hub.record({"type": "run", "wall": time.time(), "script": "synthetic.py"})

        async def every(period: float, action) -> None:
            while True:
                await asyncio.sleep(period)
                action()

        def watch() -> None:
            for verdict in verdicts + watchdog.tick():
                hub.record(verdict.record())
            verdicts.clear()

        tasks = [
            asyncio.create_task(every(1.0, hub.record_totals)),
            asyncio.create_task(every(WATCH_S, watch)),
            asyncio.create_task(every(1.0, hub.log.flush)),
            asyncio.create_task(every(1.0, hub.keep_state)),
            asyncio.create_task(every(heap.TRIM_S, heap.trim)),
        ]
        stopped = asyncio.Event()
        asyncio.get_running_loop().add_reader(stop.fileno(), stopped.set)
        await stopped.wait()
        for task in tasks:
            task.cancel()
        await hub.finish(0)
        steps = sum(r.steps_seen for r in hub.state.ranks.values())
        results.put({"steps": steps, "ranks": len(hub.state.ranks), "log_bytes": hub.log.total_bytes, "alerts": hub.state.alerts})

    asyncio.run(main())


def generate(socket_path: str, ranks: int, rate: float, seconds: float, results: multiprocessing.Queue) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per synthetic rank
    sent = asyncio.run(synthetic_job(Path(socket_path), ranks, rate, steps=int(seconds * rate), nan_every=500, checksum_every=100))
    results.put(sum(sent))


async def watch_latency(socket_path: Path, ranks: int, window: tuple[float, float], out: list[float]) -> None:
    """A dashboard's connection: the age of each step record as it arrives within the window."""
    with unixpath.usable(str(socket_path)) as short:
        reader, writer = await asyncio.open_unix_connection(short, limit=1 << 20)
    writer.write(wire.encode({"type": "viewer_hello", "history": False}))
    start, end = window
    async for frame in frames(reader, read_size=1 << 20):
        now = time.time()
        if now > end:
            break
        if frame.get("type") == "step" and now >= start:
            out.append(now - frame["wall"])
    writer.close()


def one(ranks: int, rate: float, seconds: float, warmup: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    run = rundir.create(Path("synthetic.py"), Path(scratch_folder("ddptop-scale-")) / "run")
    results: multiprocessing.Queue = ctx.Queue()
    stop_read, stop_write = multiprocessing.Pipe(duplex=False)
    supervisor = ctx.Process(target=supervise, args=(str(run.path), results, stop_read))
    supervisor.start()
    while not run.socket_path.exists():
        time.sleep(0.05)
    generator = ctx.Process(target=generate, args=(str(run.socket_path), ranks, rate, warmup + seconds + 2, results))
    generator.start()
    proc = psutil.Process(supervisor.pid)
    time.sleep(warmup)
    cpu0, rss0, t0 = proc.cpu_times(), proc.memory_info().rss, time.time()
    latencies: list[float] = []
    rss: list[int] = []
    sampling = threading.Event()

    def sample_rss() -> None:
        while not sampling.wait(seconds / 10):
            rss.append(proc.memory_info().rss)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    asyncio.run(watch_latency(run.socket_path, ranks, (t0, t0 + seconds), latencies))
    cpu1, rss1, t1 = proc.cpu_times(), proc.memory_info().rss, time.time()
    sampling.set()
    generator.join()
    sent = results.get()
    stop_write.close()
    outcome = results.get()
    supervisor.join()
    used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    lat = sorted(latencies)
    return {
        "ranks": ranks,
        "cpu": used / (t1 - t0),
        "rss0": rss0,
        "rss1": rss1,
        "ingest": len(lat) / (t1 - t0) if lat else 0.0,
        "sent": sent,
        "dropped": sent - outcome["steps"],
        "seen_ranks": outcome["ranks"],
        "p50": statistics.median(lat) * 1e3,
        "p99": lat[int(0.99 * (len(lat) - 1))] * 1e3,
        "bytes_per_rank_step": outcome["log_bytes"] / max(1, outcome["steps"]),
        "alerts": outcome["alerts"],
        "rss_samples": rss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--rate", type=float, default=10.0, help="steps per second per rank")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per N")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds for the ranks to connect first")
    args = parser.parse_args()
    scratch_home()
    print(f"{args.rate:g} steps/s per rank, {args.seconds:g} s measured after {args.warmup:g} s, one supervisor")
    print(
        f"{'ranks':>6} {'sup CPU':>8} {'RSS start':>10} {'RSS end':>9} {'records/s':>10} {'dropped':>8} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'log B/rank-step':>16} {'alerts':>7}"
    )
    for ranks in args.ranks:
        r = one(ranks, args.rate, args.seconds, args.warmup)
        print(
            f"{r['ranks']:>6} {r['cpu']:>8.0%} {r['rss0'] / 2**20:>8.0f}Mi {r['rss1'] / 2**20:>7.0f}Mi "
            f"{r['ingest']:>10,.0f} {r['dropped']:>8} {r['p50']:>7.1f} {r['p99']:>7.1f} "
            f"{r['bytes_per_rank_step']:>16.0f} {r['alerts']:>7}",
            flush=True,
        )
        print(f"{'':>6} RSS every {args.seconds / 10:g} s: " + " ".join(f"{x / 2**20:.0f}" for x in r["rss_samples"]) + " MiB", flush=True)


if __name__ == "__main__":
    main()
