"""ddptop's torch hooks in this process: real DDP on gloo at world size 1.

The end-to-end tests see the hooks through whole jobs; these look at what a
single step records against what torch says the gradients are, for the ways
scripts arrange a step (accumulation, no_sync, partial optimizers, their own
clipping, GradScaler). Every global the hooks patch is restored afterwards.
"""

from __future__ import annotations

import collections
import importlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddptop.trainer import hooks, threadstate
from ddptop.trainer.policy import GuardPolicy
from ddptop.trainer.steps import StepTracker


@pytest.fixture(scope="module")
def gloo_world_of_one() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def records(gloo_world_of_one: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """ddptop's hooks installed as in a rank; the step records they emit."""
    for cls, name in ((DistributedDataParallel, "__init__"), (DistributedDataParallel, "register_comm_hook"),
                      (torch.amp.GradScaler, "step")):
        monkeypatch.setattr(cls, name, getattr(cls, name))
    optimizer_module = importlib.import_module("torch.optim.optimizer")
    monkeypatch.setattr(optimizer_module, "_global_optimizer_pre_hooks", collections.OrderedDict())
    monkeypatch.setattr(optimizer_module, "_global_optimizer_post_hooks", collections.OrderedDict())
    out: list[dict[str, Any]] = []
    tracker = StepTracker(0, emit=out.append)
    hooks.install(tracker, GuardPolicy())
    yield out
    tracker.flush()


def ddp_model() -> DistributedDataParallel:
    torch.manual_seed(0)
    return DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))


def backward(model: nn.Module, scale: float = 1.0) -> None:
    (model(torch.randn(4, 8)).pow(2).sum() * scale).backward()


def test_every_bucket_callback_keeps_its_threads_python_state(records, monkeypatch):
    """gloo runs each bucket's callback on one of its C++ threads, which
    would otherwise make and drop a Python thread state each time (see
    threadstate.py and its own test)."""
    kept: list[int] = []
    monkeypatch.setattr(threadstate, "keep", lambda: kept.append(threading.get_ident()))
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        backward(model)
        optimizer.step()
    assert len(kept) == 3
