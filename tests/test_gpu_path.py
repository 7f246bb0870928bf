"""A GPU step's Python, run where there is no GPU: DDP on gloo whose inputs, losses and
gradients say they are on a GPU (stand_in_gpu.OnGpu), and a ring whose events pass when the
test says the GPU has caught up.

The guard and the step records take their GPU branches on a tensor's `is_cuda`: the pack
(the norms and the loss) copied into the ring and read late, a fused optimizer handed the
verdict as its found_inf, the notice that another optimizer's non-finite step is applied a step
late. test_cuda.py runs them on a real GPU, and only there; without these, code only a GPU
reaches would go unrun in CI from one GPU session to the next. What needs a device itself (a
copy in flight, no wait on the device, pinned memory) stays test_cuda.py's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import torch
from builders import steps_made
from norms import total_norm
from stand_in_gpu import Device, on_gpu
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddptop.core.policy import GuardPolicy
from ddptop.trainer import hooks, late, loss, patches
from ddptop.trainer.steps import StepTracker


def _fused_on_cpu() -> bool:
    """Whether this torch's fused AdamW steps CPU parameters (2.4 and later): the stand-in's kernels are the CPU's."""
    try:
        torch.optim.AdamW([nn.Parameter(torch.zeros(1))], fused=True)
    except RuntimeError:
        return False
    return True


FUSED = pytest.mark.skipif(not _fused_on_cpu(), reason="this torch's fused AdamW takes no CPU parameters")


class Ring(late.PinnedRing):
    """The rank's ring, counting the copies sent through it."""

    def __init__(self, device: Device) -> None:
        super().__init__(event=device.event, stream=device.stream)
        self.sent = 0

    def send(self, *args: Any, **kwargs: Any) -> late.RingRead:
        self.sent += 1
        return super().send(*args, **kwargs)


class Gpu(NamedTuple):
    device: Device
    ring: Ring


@pytest.fixture
def gpu(gloo_world_of_one: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gpu]:
    """The stand-in device, and the rank's ring with its events; torch as it was afterwards."""
    device = Device()
    ring = Ring(device)
    monkeypatch.setattr(late, "RING", ring)
    yield Gpu(device, ring)
    patches.undo()


class Job:
    """A DDP model under ddptop's hooks whose step runs on "the GPU"; its records as the sender
    reads them, each step's once the device has caught up with it."""

    def __init__(self, gpu: Gpu, optimizer: str, clips: bool = False, scaler: bool = False, policy: GuardPolicy | None = None) -> None:
        self.device = gpu.device
        self.records: list[dict[str, Any]] = []
        self.tracker = StepTracker(0, emit=self.records.append)
        hooks.install(self.tracker, policy or GuardPolicy())
        torch.manual_seed(0)
        self.model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)))
        params = self.model.parameters()
        self.optimizer = torch.optim.SGD(params, lr=1e-2, momentum=0.9) if optimizer == "sgd" else torch.optim.AdamW(params, fused=True)
        self.clips = clips
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12) if scaler else None
        self.expected: list[tuple[float, float]] = []
        """Each step's loss and grad norm, as the script would read them."""

    def step(self, nan_loss: bool = False) -> None:
        loss = self.model(on_gpu(torch.randn(8, 16))).pow(2).mean()
        if nan_loss:
            loss = loss * math.nan
        assert loss.is_cuda, "the stand-in reaches the loss"
        self.optimizer.zero_grad(set_to_none=True)
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        for param in self.model.parameters():
            param.grad = on_gpu(param.grad)  # DDP on gloo made them plain tensors: as in a GPU job, they say they are on it
        norm = total_norm([p.grad for p in self.model.parameters()])
        scale = 1.0 if self.scaler is None else self.scaler.get_scale()
        self.expected.append((loss.item(), norm / scale))
        if self.clips:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1e9)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.tracker.build()
        self.device.catch_up()

    def finish(self) -> list[dict[str, Any]]:
        return steps_made(self.tracker, self.records)


@pytest.mark.parametrize(
    ("optimizer", "clips", "scaler"),
    [
        ("sgd", False, False),
        pytest.param("adamw-fused", False, False, marks=FUSED),
        pytest.param("adamw-fused", True, False, marks=FUSED),
        pytest.param("adamw-fused", False, True, marks=FUSED),
    ],
)
def test_a_gpu_step_s_values_go_through_the_ring_and_are_read_without_a_wait(gpu, optimizer, clips, scaler):
    job = Job(gpu, optimizer, clips=clips, scaler=scaler)
    for _ in range(20):
        job.step()
    rows = job.finish()
    assert gpu.device.waits == 0, "a step's record waited for the device"
    assert gpu.ring.sent == 20, "one copy a step: the pack, with the loss in it"
    assert [r["step"] for r in rows] == list(range(20))
    shown = [(r["loss"], r["grad_norm"]) for r in rows]
    assert [s[0] for s in shown] == pytest.approx([e[0] for e in job.expected], rel=1e-6)
    assert [s[1] for s in shown] == pytest.approx([e[1] for e in job.expected], rel=1e-5)
    assert all("nonfinite" not in r for r in rows)


@FUSED
def test_a_nan_step_is_skipped_on_the_device_by_a_fused_optimizer_and_read_late(gpu):
    job = Job(gpu, "adamw-fused")
    for _ in range(3):
        job.step()
    before = [p.detach().clone() for p in job.model.parameters()]
    job.step(nan_loss=True)
    after = [p.detach().clone() for p in job.model.parameters()]
    job.step()
    rows = job.finish()
    assert all(torch.equal(b, a) for b, a in zip(before, after)), "the NaN step reached the weights"
    assert rows[3]["nonfinite"] and rows[3]["skipped"] == "nan" and rows[3]["local_nonfinite"], rows[3]
    assert math.isfinite(rows[4]["loss"]) and gpu.device.waits == 0 and gpu.ring.sent == 5
    assert not [r for r in job.records if r["type"] == "rank_note"], "nothing to say: the step was skipped"


def test_another_optimizer_s_nan_step_is_applied_read_late_and_said_once(gpu):
    job = Job(gpu, "sgd")
    job.step()
    job.step(nan_loss=True)
    job.step()
    rows = job.finish()
    assert rows[1]["nonfinite"] and "skipped" not in rows[1], rows[1]
    assert not all(math.isfinite(p.sum().item()) for p in job.model.parameters()), "SGD applied it"
    [note] = [r for r in job.records if r["type"] == "rank_note"]
    assert "SGD" in note["text"] and "--on-nan skip" in note["text"]
    assert gpu.ring.sent == 3


def test_on_nan_skip_reads_another_optimizer_s_step_at_once_and_skips_it(gpu):
    job = Job(gpu, "sgd", policy=GuardPolicy(on_nan="skip"))
    job.step()
    before = [p.detach().clone() for p in job.model.parameters()]
    job.step(nan_loss=True)
    rows = job.finish()
    assert rows[1]["nonfinite"] and rows[1]["skipped"] == "nan"
    assert all(torch.equal(b, p) for b, p in zip(before, job.model.parameters()))
    assert gpu.ring.sent == 0, "read at once (on a GPU, at a wait for the backward pass), not through the ring"


def test_a_step_a_grad_scaler_skipped_sends_its_loss_through_the_ring(gpu):
    """A GradScaler that finds an inf never calls SGD's step, so the guard never packs that
    step's loss: it goes to the host in a pack of its own (optimizer_step.losses_only)."""
    job = Job(gpu, "sgd", scaler=True)
    job.step()
    job.step(nan_loss=True)
    job.step()
    rows = job.finish()
    assert rows[1]["skipped"] == "scaler" and math.isnan(rows[1]["loss"]), rows[1]
    assert rows[2]["loss"] == pytest.approx(job.expected[2][0], rel=1e-6)
    assert gpu.ring.sent == 3 and gpu.device.waits == 0


def test_the_losses_of_a_step_no_guard_packed_are_summed_on_the_device_and_read_late(gpu):
    """loss.unpacked: a closed step's backward() values (a step no optimizer closed): one copy,
    of their sum; a value that is no loss (a backward on a non-scalar) is left out."""
    read = loss.unpacked([on_gpu(torch.tensor(1.5)), on_gpu(torch.tensor(2.0)), on_gpu(torch.ones(3))])
    assert isinstance(read, late.RingRead) and gpu.ring.sent == 1 and not read.ready()
    gpu.device.catch_up()
    assert read.ready() and read.get() == 3.5 and gpu.device.waits == 0


def test_a_loss_given_to_monitor_step_on_the_gpu_is_read_late(gpu):
    """late.scalar, as monitor.step(loss=...) reads a GPU tensor: a copy started, not a wait."""
    read = late.scalar(on_gpu(torch.tensor([2.5])))
    assert isinstance(read, late.RingRead) and not read.ready() and gpu.ring.sent == 1
    gpu.device.catch_up()
    assert read.get() == 2.5 and gpu.device.waits == 0
