"""What reading torch's flight recorder costs the rank that reads it: its dump and its unpickling;
and, beside it, what ddptop's timing of a sharded step's collectives costs each one it times.

ddptop reads the recorder only once a rank has sat on one step for a few
seconds (trainer/flightrecorder.py): where each group stands in its
collectives. Timing a sharded job's collectives from it every second would
read it all the time. This fills the recorder of each of 2 ranks on gloo
with --entries all-reduces, as a job that ran that many collectives has it,
and times rank 0's dump (torch's _dump_fr_trace, C++) and the unpickling of
what it returns (pickle.loads), each the median of --reads reads. Both hold
the GIL: the training thread waits through them.

What ddptop does instead (trainer/collective_timer.py) passes one step's
collectives a second through a timing function. Its cost per collective:
the timing function around one that does nothing, against that one alone,
the difference of the medians of 40 alternating rounds of 5,000 calls;
the same for a functional collective of tensor parallelism's, its launch
and its wait (trainer/functional_timing.py); and what arming and disarming
it cost, once for each step it times.

    python bench/flight_recorder.py --entries 2000
    python bench/flight_recorder.py --entries 200
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def measure(entries: int, reads: int) -> None:
    import torch
    import torch.distributed as dist

    from ddptop.trainer import torchapi

    dist.init_process_group("gloo")
    x = torch.ones(64)
    for _ in range(entries):
        dist.all_reduce(x)
    dump = torchapi.flight_recorder_dumps()[-1]  # the generic recorder, gloo's
    dumping, loading = [], []
    for _ in range(reads):
        started = time.perf_counter()
        raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        dumped = time.perf_counter()
        trace = pickle.loads(raw)
        dumping.append(dumped - started)
        loading.append(time.perf_counter() - dumped)
    wrapped, functional, arming = timer_cost(x), functional_cost(x), arming_cost()
    if dist.get_rank() == 0:
        print(
            f"the collective timer's cost per collective it times (medians of 40 rounds of 5,000 calls): {wrapped * 1e6:.2f} µs; per functional collective (tensor parallelism's), its launch and wait: {functional * 1e6:.2f} µs; arming and disarming it, once a step is timed: {arming * 1e6:.1f} µs"
        )
        print(
            f"flight recorder of {len(trace['entries'])} entries ({len(raw) / 1024:.0f} KiB), rank 0 of 2 on gloo, median of {reads} reads: "
            f"dump {statistics.median(dumping) * 1e3:.1f} ms, unpickling {statistics.median(loading) * 1e3:.1f} ms"
        )
    dist.destroy_process_group()


def armed_less_unarmed(call: Callable[[], object], rounds: int = 40, calls: int = 5_000) -> float:
    """Seconds the armed timer adds to one call(): the medians of rounds of that many calls,
    armed and not in turn. A round is fewer calls than the timer keeps in a step
    (timed_collectives.TIMED_KEPT)."""
    from ddptop.trainer.collective_timer import CollectiveTimer

    timer, took = CollectiveTimer(), {False: list[float](), True: list[float]()}
    for _ in range(rounds):
        for armed in (False, True):
            if armed:
                timer.arm()
            started = time.perf_counter()
            for _ in range(calls):
                call()
            took[armed].append((time.perf_counter() - started) / calls)
            if armed:
                timer.disarm()
    return statistics.median(took[True]) - statistics.median(took[False])


def timer_cost(x: object) -> float:
    """Seconds the armed timer adds to one collective (see above): a collective's own time
    varies by more than that from one call to the next, so the timer wraps a function that
    does nothing, in torch.distributed's place for the while, against that function alone."""
    import torch.distributed as dist

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    own, dist.all_reduce = dist.all_reduce, nothing
    try:
        return armed_less_unarmed(lambda: dist.all_reduce(x))
    finally:
        dist.all_reduce = own


class Launched:
    """What a functional collective returns before its wait (an AsyncCollectiveTensor's shape)."""

    completed = False

    def __init__(self, elem: object) -> None:
        self.elem = elem


def functional_cost(x: Any) -> float:
    """Seconds the armed timer adds to one of DTensor's functional collectives, its launch and
    the wait for its output (trainer/functional_timing.py), as timer_cost does for
    torch.distributed's: around stand-ins that do nothing, given the (mesh, dimension) DTensor
    passes, against those stand-ins alone."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    group, out = (init_device_mesh("cpu", (2,)), 0), Launched(x)

    def launch(*args: object, **kwargs: object) -> Launched:
        return out

    def wait(tensor: object) -> object:
        return tensor

    own, (funcol.all_reduce, funcol.wait_tensor) = (funcol.all_reduce, funcol.wait_tensor), (launch, wait)
    try:
        return armed_less_unarmed(lambda: funcol.wait_tensor(funcol.all_reduce(x, "sum", group).elem))
    finally:
        funcol.all_reduce, funcol.wait_tensor = own


def arming_cost(pairs: int = 10_000) -> float:
    """Seconds one arm() and disarm() take: once a second, at two steps' ends. DTensor's
    functional collectives are imported, as in any job FSDP2 or tensor parallelism shards:
    their functions are swapped too."""
    import torch.distributed._functional_collectives  # noqa: F401 - imported for its functions to be swapped

    from ddptop.trainer.collective_timer import CollectiveTimer

    timer = CollectiveTimer()
    started = time.perf_counter()
    for _ in range(pairs):
        timer.arm()
        timer.disarm()
    return (time.perf_counter() - started) / pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=2000, help="collectives run first, and the recorder's size")
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    if "WORLD_SIZE" not in os.environ:
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": str(args.entries)}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, *sys.argv[1:]]
        sys.exit(subprocess.run(torchrun, env=env).returncode)
    measure(args.entries, args.reads)


if __name__ == "__main__":
    main()
