"""The GPU memory readings a rank attaches to its steps: read at most every
interval, carried by the steps in between (no CUDA needed: the allocator's
read is injected, as the clock)."""

import pytest

from ddptop.trainer.gpumemory import MemoryReadings, read_allocator


class Allocator:
    def __init__(self) -> None:
        self.reads = 0
        self.used = True

    def __call__(self) -> dict[str, int]:
        self.reads += 1
        return {"mem_alloc": 100 * self.reads, "mem_reserved": 1000, "mem_peak": 100 * self.reads} if self.used else {}


def test_reads_at_most_every_interval_and_steps_between_carry_the_last_reading():
    allocator, now = Allocator(), [10.0]
    readings = MemoryReadings(read=allocator, clock=lambda: now[0], every=0.1)
    first = readings.get()
    now[0] += 0.05
    assert readings.get() == first == {"mem_alloc": 100, "mem_reserved": 1000, "mem_peak": 100}
    assert allocator.reads == 1
    now[0] += 0.06
    assert readings.get()["mem_alloc"] == 200 and allocator.reads == 2


def test_each_step_gets_its_own_dict():
    readings = MemoryReadings(read=Allocator(), clock=lambda: 0.0)
    readings.get()["comm_ms"] = 1.0
    assert "comm_ms" not in readings.get()


def test_an_empty_reading_is_retried_at_the_next_step():
    allocator = Allocator()
    allocator.used = False
    readings = MemoryReadings(read=allocator, clock=lambda: 0.0, every=60.0)
    assert readings.get() == {}
    allocator.used = True
    assert readings.get()["mem_alloc"] == 200


def test_without_cuda_in_use_the_allocator_reads_empty():
    import torch

    if torch.cuda.is_initialized():
        pytest.skip("CUDA is in use in this test process")
    assert read_allocator() == {}
