"""What the sender's thread pays to make a step's record, on the CPU's path and on a GPU's.

The sender's thread holds the GIL while it turns the training thread's journal into records
(trainer/steps.py), and a training thread that launches kernels from Python may wait for it
then. `bench/inrank.py` measures that thread's CPU on the path the machine takes; this one
times `StepTracker.build()` alone on both paths on any machine: the CPU's, whose pack is read
on the training thread (late.Read), and a GPU's, whose pack goes through the pinned ring and
is read once its event has passed (late.RingRead). Without a GPU the ring's events are
stand-ins that have passed by the time build() runs, as a GPU's a step later usually have.

    python bench/records.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from ddptop.trainer import guard, late
from ddptop.trainer.steps import StepTracker


class PassedEvent:
    """A CUDA event's record, query and synchronize, passed as soon as it is asked: a copy that
    finished long before its record is made, as a step's usually has a step later."""

    def record(self, stream: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def per_record_us(gpu: bool, steps: int, rounds: int) -> float:
    """µs of build() a record, the median over rounds of `steps` steps each."""
    ring = late.PinnedRing(event=PassedEvent, stream=lambda device: None)
    layout = guard.Layout(16, False, False, (False,), False, False, False, False, None, True)
    tracker = StepTracker(0, emit=lambda record: None)
    pack = torch.randn(17)  # the example MLP's 16 gradient norms and its loss

    def journal(count: int) -> None:
        """What the training thread journals for count steps of the example, with monitor.step()."""
        for _ in range(count):
            tracker.forward_begin(32, None, 1)
            values = ring.send(pack, layout.fields) if gpu else late.Read((pack.tolist(), layout.fields))
            tracker.optimizer_begin({late.FIELDS: values})
            tracker.optimizer_end({"lr": 0.01})
            tracker.explicit(None, 32, None)

    journal(steps)
    tracker.build()  # warm
    took = []
    for _ in range(rounds):
        journal(steps)
        start = time.perf_counter()
        tracker.build()
        took.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="steps a build() makes the records of (a flush's, at 1,000 steps a second)")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    for gpu in (False, True, False, True):  # alternating: a drift of the machine falls on both
        path = "a GPU's (the pinned ring, stand-in events)" if gpu else "the CPU's (read on the training thread)"
        print(f"build(), {path}: {per_record_us(gpu, args.steps, args.rounds):.2f} µs a record")


if __name__ == "__main__":
    main()
