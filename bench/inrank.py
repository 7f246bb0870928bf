"""What ddptop's hooks cost inside one rank, without torchrun or a supervisor.

overhead.py measures whole jobs, where the supervisor, torchrun's log
threads and machine drift blur a few hundred microseconds. This runs the
example job's own loop (its model, loader and optimizer) at world size 1 in
a fresh process per configuration, alternating, with ddptop's hooks
installed or not; records go to a list instead of a socket. It attributes
the difference: `--profile` prints where the hooked loop spends its time.

    python bench/inrank.py --width 256 --batch-size 32 --steps 1500 --rounds 3
    python bench/inrank.py --width 8192 --batch-size 1024 --steps 300 --profile

It uses CUDA (NCCL) when torch sees a GPU, gloo otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from overhead import alternating, device

REPO = Path(__file__).resolve().parent.parent


def loop(args: argparse.Namespace) -> None:
    """One configuration, in this process: prints "ms-per-step X" for the parent."""
    sys.path.insert(0, str(REPO / "examples"))
    import torch
    import torch.distributed as dist
    from torch import nn

    from ddptop.trainer import monitor

    if args.hooked:
        from ddptop.trainer import hooks
        from ddptop.trainer.policy import GuardPolicy
        from ddptop.trainer.steps import StepTracker

        records: list = []
        tracker = StepTracker(0, emit=records.append)
        monitor.bind(tracker)
        hooks.install(tracker, GuardPolicy(on_nan=args.on_nan))
    import train as example

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(example.make_model(args.width).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    data_args = argparse.Namespace(seed=0, samples=max(8192, 2 * args.batch_size), batch_size=args.batch_size)
    data = example.batches(example.make_loader(data_args, 0, 1), 0, 0)

    def run(steps: int) -> None:
        for _ in range(steps):
            _, _, (x, y) = next(data)
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            monitor.step(loss=loss, samples=x.shape[0])
        if cuda:
            torch.cuda.synchronize()

    run(50)
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(run, args.steps)
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(20)
        stats.sort_stats("cumtime").print_stats("trainer", 20)
    started = time.perf_counter()
    run(args.steps)
    print(f"ms-per-step {(time.perf_counter() - started) / args.steps * 1e3:.4f}", flush=True)
    dist.destroy_process_group()


def measure(args: argparse.Namespace, hooked: bool) -> float:
    cmd = [sys.executable, __file__, "--child", "--width", str(args.width), "--batch-size", str(args.batch_size),
           "--steps", str(args.steps), "--on-nan", args.on_nan] + (["--hooked"] if hooked else [])
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env={**os.environ, "MASTER_ADDR": "127.0.0.1"})
    for line in result.stdout.splitlines():
        if line.startswith("ms-per-step "):
            return float(line.split()[1])
    sys.exit(f"bench: run failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--on-nan", default="auto", help="the guard's policy (auto never waits on CUDA; skip does)")
    parser.add_argument("--profile", action="store_true", help="print where the hooked loop spends its time, then measure")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hooked", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        loop(args)
        return
    if args.profile:
        args.hooked = True
        loop(args)
        return

    times = alternating(args.rounds, {"plain": lambda: measure(args, False), "ddptop hooks": lambda: measure(args, True)}, " ms")
    plain, hooked = statistics.median(times["plain"]), statistics.median(times["ddptop hooks"])
    print(f"\none rank on {device()}, width {args.width}, batch {args.batch_size}, {args.steps} steps, "
          f"{args.rounds} alternating rounds; --on-nan {args.on_nan}")
    print(f"median ms/step: plain {plain:.3f}, with ddptop's hooks {hooked:.3f}; "
          f"cost {(hooked - plain) * 1e3:.0f} µs a step, ratio of steps/s {plain / hooked:.3f}")


if __name__ == "__main__":
    main()
