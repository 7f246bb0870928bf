"""ddptop's hooks on a model FSDP1 wraps (FullyShardedDataParallel), in this process at world size 1.

At world size 1 FSDP1 keeps every parameter whole (it takes NO_SHARD, as it says): such a model
is guarded as a DDP model is, with its steps begun at the root's forward. Its sharded steps need
two ranks: tests/test_e2e_real_trainers.py runs them (tests/scripts/fsdp1_job.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import pytest
import torch
from hooked import Records, installed
from torch import nn

from ddptop.core.policy import GuardPolicy

fsdp = pytest.importorskip("torch.distributed.fsdp")


@pytest.fixture
def records(gloo_world_of_one: None) -> Iterator[Records]:
    with installed(GuardPolicy(desync_every=1)) as out:
        yield out


def wrapped_model() -> nn.Module:
    """Each Linear its own unit inside the root's, as an auto-wrap policy makes them."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP1 says it takes NO_SHARD at world size 1
        return fsdp.FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), device_id=torch.device("cpu"))


def test_an_fsdp1_models_steps_begin_at_its_roots_forward_with_its_samples(records):
    model = wrapped_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        for _ in range(2):  # two micro-batches a step
            model(torch.randn(3, 8)).pow(2).mean().backward()
            assert records.tracker.phase == "backward"
        optimizer.step()
        optimizer.zero_grad()
    assert records.tracker.forwards == 4, "one a forward: the units inside the root's add none"
    assert [r["samples"] for r in records.steps()] == [6, 6]


def test_the_models_own_clip_grad_norm_is_the_steps_grad_norm(records):
    """FSDP1's clip_grad_norm_ method, not torch's function (which it calls itself when no unit
    shards): counted once, so its norm is the step's."""
    model = wrapped_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).pow(2).sum().backward()
    norm = model.clip_grad_norm_(0.01).item()
    optimizer.step()
    (record,) = records.steps()
    assert record["grad_norm"] == pytest.approx(norm, rel=1e-6) and norm > 0.01


def test_an_fsdp1_model_that_keeps_its_parameters_whole_is_guarded_as_a_ddp_model(records):
    """NO_SHARD all-reduces whole gradients, as DDP does: its parameters are compared for a
    desync, and a non-finite step is skipped on every rank alike."""
    model = wrapped_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    (model(torch.randn(4, 8)).pow(2).mean() * math.inf).backward()
    optimizer.step()
    first, second = records.steps()
    assert "checksum" in first and "grad_norm" in first
    assert second["nonfinite"] and second["skipped"] == "nan"
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert not any(r["type"] == "rank_note" for r in records)
