"""DDP's sampled comm timings as a rank reads them (trainer/sampled.py): real DDP on gloo at world size 1."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import accumulating_step
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddptop.core.policy import GuardPolicy
from ddptop.trainer import hooks, patches
from ddptop.trainer.sampled import Sampled, rate_for
from ddptop.trainer.steps import StepTracker


def test_ddps_first_timings_are_asked_for_at_every_read_until_found_then_once_a_second(gloo_world_of_one):
    """DDP publishes an iteration's timings at the next forward, so the read made as the job
    starts finds none. Asked for again only a second later, a job shorter than that would
    report no comm figures at all; so until the first is found, every read asks."""
    now = [0.0]
    sampled = Sampled(clock=lambda: now[0])
    hooks.install(StepTracker(0, emit=lambda record: None), GuardPolicy(), sampled)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def step() -> None:
            model(torch.randn(4, 8)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

        assert "comm_ms" not in sampled.read() and sampled.comm_due  # the sender's first read, as the job starts
        step()  # the training thread reads after it: DDP has published nothing yet
        assert not sampled.comm_due
        sampled.read()  # the sender's next read, within the same second
        assert sampled.comm_due, "no reading found yet: asked for again at once"
        step()  # its forward published the first iteration's timings; read after it
        sampled.read()
        assert not sampled.comm_due, "found: the next is asked for a second after the last"
        now[0] = 1.0
        values = sampled.read()
        assert values["comm_ms"] > 0 and values["comm_bytes"] == (8 * 16 + 16 + 16 * 2 + 2) * 4, values
        assert sampled.comm_due
    finally:
        patches.undo()


def test_a_step_that_accumulates_over_micro_batches_counts_the_compute_of_all_of_them(gloo_world_of_one):
    """DDP times only the forward and backward that synchronise: with three micro-batches a
    step, the last. A rank slow in all three would seem slow in one, its lag a third of what
    it costs the others; so the step's compute is the synced one's times three."""
    now = [0.0]
    sampled, records = Sampled(clock=lambda: now[0]), []
    tracker = StepTracker(0, emit=records.append)
    hooks.install(tracker, GuardPolicy(), sampled)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(32, 64)
        for _ in range(3):
            accumulating_step(model, optimizer, x)
            tracker.build(sampled.read())
            now[0] += 1.0
        accumulating_step(model, optimizer, x)  # its forward published the last step's timings, read after it
        tracker.flush(sampled.read(now=True))
        measured = [r for r in records if "compute_ms" in r]
        assert measured, records
        ddp = model._get_ddp_logging_data()
        synced = (ddp["forward_compute_time"] + ddp["backward_compute_time"]) / 1e6
        last = measured[-1]
        assert last["comm_step"] == 2 and last["compute_ms"] == pytest.approx(3 * synced), (last, synced)
    finally:
        patches.undo()


def test_ddp_samples_a_model_once_a_reading_at_the_pace_it_runs_and_a_capture_holds_that_rate(gloo_world_of_one):
    """DDP samples every 100th iteration: for a job of 1 s steps, comm figures 100 s old. Each read
    takes the job's pace, and DDP's sample rate follows it. The clock moves a second a step, and
    `every` stands for the read interval: at 0.1 ms every step is slower than a reading, at 1000 s
    none is."""

    def steps(sampled: Sampled, n: int) -> Any:
        now = [0.0]
        sampled._clock = lambda: now[0]
        hooks.install(StepTracker(0, emit=lambda record: None), GuardPolicy(), sampled)
        try:
            torch.manual_seed(0)
            model = DistributedDataParallel(nn.Linear(8, 2))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(n):
                model(torch.randn(4, 8)).pow(2).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                sampled.read()  # due at each: the training thread reads after the next step
                now[0] += 1.0
            model(torch.randn(4, 8)).sum()  # publishes the last iteration's timings, if it was sampled
            return model
        finally:
            patches.undo()

    slow = Sampled(every=1e-4)
    model = steps(slow, 30)
    assert model._get_ddp_logging_data()["iteration"] == 30, "sampled at every iteration once the pace was read"
    slow.hold_rate(1)  # a capture, then its end: back to the pace's rate, not DDP's own
    slow.hold_rate(None)
    for _ in range(5):
        model(torch.randn(4, 8)).sum().backward()
    model(torch.randn(4, 8)).sum()
    assert model._get_ddp_logging_data()["iteration"] == 36  # 30 steps, a forward, 5 iterations

    fast = steps(Sampled(every=1000.0), 30)
    assert fast._get_ddp_logging_data()["iteration"] == 10, "DDP's own rate: its first 10 iterations, then every 100th"


def test_the_rate_is_the_smallest_round_one_that_samples_at_most_once_a_reading():
    assert [rate_for(pace) for pace in (0.2, 1.0, 3.9, 15.0, 99.0, 100.0, 5000.0)] == [1, 1, 5, 20, 100, 100, 100]
    assert rate_for(500.0, every=0.1) == 50


def test_one_long_gap_between_steps_leaves_a_fast_jobs_rate_be_and_a_slowdown_lowers_it():
    """An evaluation or a checkpoint between two steps is one slow pace: sampling every step for
    the next second would cost a fast GPU job a wait at each of its forwards."""
    now = [0.0]
    sampled = Sampled(clock=lambda: now[0])
    rates = []
    step = 0
    for gap, steps in ((1.0, 500), (1.0, 500), (60.0, 1), (1.0, 500), (1.0, 2), (1.0, 2), (1.0, 500)):
        now[0] += gap
        step += steps
        sampled.read_comm(step)
        rates.append(sampled.rate)
    assert rates == [100, 100, 100, 100, 100, 2, 100]
