"""What watching a job from outside costs it: a 2-rank job's steps/s, watched and not, in turns.

A DDP job on gloo that ddptop did not launch (plain torchrun) trains without
end; rank 0 writes its step count to a file every STEP_MARK steps. Rounds of
--round-s seconds alternate between no watcher and `ddptop top`'s watcher
(supervisor/outside/watch.py: discovery, psutil and NVML readings once a
second, py-spy's non-blocking read of each rank every 2 s), started before
the round's window opens. The job's steps/s in each round are read off the
file; the ratio is watched over not watched.

    python bench/outside.py --rounds 6 --round-s 10
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

STEP_MARK = 10
JOB = f"""
import sys, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
model = DistributedDataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
mark = open(sys.argv[1], "w") if dist.get_rank() == 0 else None
step = 0
while True:
    opt.zero_grad()
    model(torch.randn(64, 256)).pow(2).mean().backward()
    opt.step()
    step += 1
    if mark is not None and step % {STEP_MARK} == 0:
        mark.seek(0); mark.write(f"{{step:>12}}"); mark.flush()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def steps(path: Path) -> int:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else 0


def rate(mark: Path, seconds: float) -> float:
    """Steps a second over the next seconds."""
    first, start = steps(mark), time.monotonic()
    time.sleep(seconds)
    return (steps(mark) - first) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each kind, alternating")
    parser.add_argument("--round-s", type=float, default=10.0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ddptop-bench-outside-"))
    script, mark = folder / "job.py", folder / "steps"
    script.write_text(JOB)
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), str(script), str(mark)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    rates: dict[bool, list[float]] = {False: [], True: []}
    try:
        deadline = time.monotonic() + 120
        while steps(mark) < 10 * STEP_MARK:
            if time.monotonic() > deadline or job.poll() is not None:
                raise SystemExit("the job did not start training")
            time.sleep(0.2)
        rate(mark, args.round_s)  # warm up
        for _ in range(args.rounds):
            for watched in (False, True):
                watcher = None
                if watched:
                    run = folder / f"watch-{time.monotonic_ns()}"
                    run.mkdir()
                    watcher = subprocess.Popen(
                        [sys.executable, "-m", "ddptop.supervisor.outside.watch", str(job.pid), str(run)], stdout=subprocess.DEVNULL
                    )
                    while not (run / "sock").exists():
                        time.sleep(0.05)
                    time.sleep(2.0)  # its first looks done: the round sees it as it runs
                rates[watched].append(rate(mark, args.round_s))
                if watcher is not None:
                    watcher.terminate()
                    watcher.wait(timeout=10)
    finally:
        # torchrun's workers outlive it when it is killed first: the whole family at once.
        family = [job.pid, *(child.pid for child in psutil.Process(job.pid).children(recursive=True))]
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
    plain, watched = statistics.mean(rates[False]), statistics.mean(rates[True])
    print(f"2-rank DDP job on gloo, {args.rounds} rounds of {args.round_s:g} s each, alternating")
    print(f"not watched: {plain:.1f} steps/s  (rounds: {', '.join(f'{r:.1f}' for r in rates[False])})")
    print(f"watched:     {watched:.1f} steps/s  (rounds: {', '.join(f'{r:.1f}' for r in rates[True])})")
    print(f"watched / not watched: {watched / plain:.3f}")


if __name__ == "__main__":
    main()
