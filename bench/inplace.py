"""Where ddptop's in-rank cost goes: each place it runs Python at in a step, timed inside the loop.

inrank.py says what ddptop costs a step as a whole, against plain DDP and
the floor. This says where: the example job's loop (inrank.Job) runs under
ddptop's hooks with a clock read around each place ddptop runs at, and
around the torch callable each wrapper calls, whose time is subtracted:

- the forward wrapper (DistributedDataParallel.forward, less the forward);
- the backward wrapper (torch.autograd.backward, less the backward);
- the comm hook (less the all-reduce's launch, hooks.allreduce_buffer);
- the optimizer's pre-hook (the guard: its norm and read included) and post-hook;
- monitor.step().

Beside them, the floor job's (inrank.floor) pre-hook, its grad norm verdict,
timed the same way: ddptop's pre-hook does that work too. The same lines
timed in a warm loop take a fraction of this: in the loop they run cold,
between torch's kernels, which is what a training step pays.

    python bench/inplace.py --steps 3000

The medians of each place's time per step, on rank 0, world size 1.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import inrank

Times = collections.defaultdict[str, list[int]]


def timed(times: Times, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """function, with the nanoseconds of each call kept under name."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return function(*args, **kwargs)
        finally:
            times[name].append(time.perf_counter_ns() - start)

    return call


def timed_comm_hooks(times: Times) -> None:
    """Every comm hook ddptop registers from now on, timed (under its own name: DDP reads the parameters')."""
    from ddptop.trainer import hooks

    make = hooks._timed

    def _timed(hook: Any, probe: Any, reduced: Any) -> Any:
        inner = make(hook, probe, reduced)

        def comm_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the parameter's name and annotation
            start = time.perf_counter_ns()
            future = inner(state, bucket)
            times["comm hook"].append(time.perf_counter_ns() - start)
            return future

        return comm_hook

    hooks._timed = _timed


def measure(args: argparse.Namespace) -> Times:
    sys.path.insert(0, str(inrank.REPO / "examples"))
    import torch
    import torch.distributed as dist
    import train as example
    from torch.nn.parallel import DistributedDataParallel

    from ddptop.trainer import hooks, monitor, patches
    from ddptop.trainer.policy import GuardPolicy

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    device = torch.device("cpu")
    times: Times = collections.defaultdict(list)
    floor = inrank.floor(args, example, device, norm=True)
    verdicts = floor.optimizer._optimizer_step_pre_hooks  # the floor's own, registered inside inrank.floor
    for key, hook in verdicts.items():
        verdicts[key] = timed(times, "floor: pre-hook (grad norm verdict)", hook)

    # The torch callables ddptop wraps, timed before it wraps them: their time is taken off the wrappers'.
    DistributedDataParallel.forward = timed(times, "forward itself", DistributedDataParallel.forward)
    torch.autograd.backward = timed(times, "backward itself", torch.autograd.backward)
    hooks.allreduce_buffer = timed(times, "all-reduce launch", hooks.allreduce_buffer)
    timed_comm_hooks(times)
    optimizer_hooks = inrank.caught_optimizer_hooks()
    tracker = inrank.sending_tracker()
    hooks.install(tracker, GuardPolicy())
    DistributedDataParallel.forward = timed(times, "forward wrapper", DistributedDataParallel.forward)
    torch.autograd.backward = timed(times, "backward wrapper", torch.autograd.backward)
    job = inrank.Job(args, example, device)
    job.optimizer.register_step_pre_hook(timed(times, "optimizer pre-hook (the guard)", optimizer_hooks["pre"]))
    job.optimizer.register_step_post_hook(timed(times, "optimizer post-hook", optimizer_hooks["post"]))
    monitor.bind(tracker)
    monitor.step = timed(times, "monitor.step()", monitor.step)
    job.run(args.warmup_steps)
    times.clear()
    job.run(args.steps)
    measured: Times = collections.defaultdict(list, {name: list(values) for name, values in times.items()})
    monitor.bind(None)
    with patches.suspended():  # the floor job runs through torch's own callables (timed, but not kept)
        floor.run(args.warmup_steps)
        times.clear()
        floor.run(args.steps)
    measured["floor: pre-hook (grad norm verdict)"] = times["floor: pre-hook (grad norm verdict)"]
    dist.destroy_process_group()
    return measured


def report(args: argparse.Namespace, times: Times) -> None:
    def median(name: str) -> float:
        return statistics.median(times[name]) / 1000

    places = {
        "forward wrapper, less the forward": median("forward wrapper") - median("forward itself"),
        "backward wrapper, less the backward": median("backward wrapper") - median("backward itself"),
        "comm hook, less the all-reduce's launch": median("comm hook") - median("all-reduce launch"),
        "optimizer pre-hook (the guard)": median("optimizer pre-hook (the guard)"),
        "optimizer post-hook": median("optimizer post-hook"),
        "monitor.step()": median("monitor.step()"),
    }
    print(f"one rank on CPU (gloo), width {args.width}, batch {args.batch_size}: µs a step, median of {args.steps} steps")
    for name, us in places.items():
        print(f"  {name:<44}{us:>8.2f}")
    floor = median("floor: pre-hook (grad norm verdict)")
    print(f"  {'the floor job: its pre-hook (grad norm verdict)':<44}{floor:>8.2f}")
    print(f"ddptop's places beyond the floor's verdict: {sum(places.values()) - floor:.1f} µs a step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warmup-steps", type=int, default=200)
    args = parser.parse_args()
    report(args, measure(args))
    inrank.exit_now()


if __name__ == "__main__":
    main()
