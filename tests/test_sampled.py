"""DDP's sampled comm timings as a rank reads them (trainer/sampled.py): real DDP on gloo at world size 1."""

from __future__ import annotations

import pytest
import torch
from conftest import accumulating_step
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddptop.trainer import hooks, patches
from ddptop.trainer.policy import GuardPolicy
from ddptop.trainer.sampled import Sampled
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
