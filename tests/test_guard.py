"""The in-rank guard on real tensors and a real optimizer, in this process."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ddptop.trainer import guard
from ddptop.trainer.policy import GuardPolicy


def model_with_grads(scale: float = 1.0, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    (model(torch.randn(4, 8)).sum() * scale).backward()
    return model


def grad_norm(grads: list[torch.Tensor]) -> float | None:
    """The guard's norm of grads, as a step with no buckets and no scaler reads it (none without gradients)."""
    return guard.norms_now(grads, grads)[0] if grads else None


def test_grad_norm_matches_torch_and_sees_inf():
    model = model_with_grads()
    grads = [p.grad for p in model.parameters()]
    expected = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
    assert math.isclose(grad_norm(grads), expected, rel_tol=1e-6)
    grads[1].view(-1)[0] = float("inf")
    assert grad_norm(grads) == math.inf
    assert grad_norm([]) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_one_bucket_s_norm_is_the_foreach_norm_to_the_bit(dtype):
    """norm_of takes one CPU tensor's norm directly, for speed; it must be the value _foreach_norm gives."""
    torch.manual_seed(0)
    for size in (1, 1000, 85_002, 3_000_001):
        bucket = (torch.randn(size) * 7).to(dtype)
        direct, foreach = guard.norm_of([bucket]), torch._foreach_norm([bucket])[0]
        assert direct.dtype == foreach.dtype and direct.item() == foreach.item()
    bucket[-1] = float("nan")
    assert math.isnan(guard.norm_of([bucket]).item())


def test_clip_enforces_the_norm_and_leaves_clipped_grads_bitwise_alone():
    model = model_with_grads(scale=1e4)
    grads = [p.grad for p in model.parameters()]
    assert guard.clip(grads, grad_norm(grads), 1.0)
    assert grad_norm(grads) <= 1.0 + 1e-6

    script_clipped = model_with_grads(scale=1e4, seed=1)
    torch.nn.utils.clip_grad_norm_(script_clipped.parameters(), 1.0)
    before = [p.grad.clone() for p in script_clipped.parameters()]
    grads = [p.grad for p in script_clipped.parameters()]
    assert not guard.clip(grads, grad_norm(grads), 1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, grads))


def test_skip_leaves_weights_and_optimizer_state_untouched():
    model = model_with_grads()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    optimizer.step()
    weights = [p.detach().clone() for p in model.parameters()]
    state = {k: {n: t.clone() for n, t in v.items()} for k, v in optimizer.state.items()}
    (model(torch.randn(4, 8)).sum()).backward()
    guard.skip(optimizer)
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    for key, values in state.items():
        assert all(torch.equal(values[n], optimizer.state[key][n]) for n in values)


def test_local_check_names_a_non_finite_bucket():
    check = guard.LocalCheck()
    check.add(torch.ones(10))
    assert guard.any_nonfinite(check.take()) is False
    check.add(torch.ones(10))
    check.add(torch.tensor([1.0, float("nan")]))
    assert guard.any_nonfinite(check.take()) is True
    assert guard.any_nonfinite(check.take()) is None


def test_checksum_is_exact_and_order_sensitive():
    a, b = torch.randn(100), torch.randn(7, 3).to(torch.bfloat16)
    assert guard.checksum([a, b]) == guard.checksum([a.clone(), b.clone()])
    nudged = a.clone()
    nudged[0] = torch.nextafter(nudged[0], torch.tensor(math.inf))
    assert guard.checksum([nudged, b]) != guard.checksum([a, b])
    assert guard.checksum([b, a]) != guard.checksum([a, b])
    assert 0 <= guard.checksum([a, b]) < 1 << 63


def test_the_late_verdict_agrees_with_the_one_taken_now():
    model = model_with_grads(scale=1e4)
    grads = [p.grad for p in model.parameters()]
    norm = grad_norm(grads)
    expected = [g.clone() for g in grads]
    guard.clip(expected, norm, 1.0)
    local = guard.LocalCheck()
    local.add(torch.ones(3))
    values = guard.verdict_late(guard.Gradients.of(grads), local.take(), clip_grad=1.0)
    assert values == {"grad_norm": pytest.approx(norm, rel=1e-6), "clipped": True}
    assert all(torch.allclose(a, b, rtol=1e-6) for a, b in zip(grads, expected))

    under = [g.clone() for g in grads]
    assert guard.verdict_late(guard.Gradients.of(under), [], clip_grad=10.0)["clipped"] is False
    assert all(torch.equal(a, b) for a, b in zip(under, grads)), "gradients under the norm must be left bitwise alone"


def test_the_late_verdict_names_a_non_finite_step_and_its_source():
    grads = [p.grad for p in model_with_grads().parameters()]
    grads[0].view(-1)[0] = float("nan")
    local = guard.LocalCheck()
    local.add(torch.tensor([float("nan")]))
    assert guard.verdict_late(guard.Gradients.of(grads), local.take(), None) == {"nonfinite": True, "local_nonfinite": True}
    assert guard.verdict_late(guard.Gradients.of(grads), [torch.ones(())], None) == {"nonfinite": True, "local_nonfinite": False}
    assert guard.verdict_late(guard.Gradients.of(grads), [], None) == {"nonfinite": True, "local_nonfinite": None}


@pytest.mark.parametrize(
    "on_nan, cpu, cuda",
    [
        ("auto", True, False),
        ("skip", True, True),
        ("restart", True, True),
        ("stop", True, True),
        ("warn", False, False),
    ],
)
def test_only_a_skip_makes_a_rank_wait_for_the_verdict(on_nan, cpu, cuda):
    policy = GuardPolicy(on_nan=on_nan)
    assert (policy.skips_now(cuda=False), policy.skips_now(cuda=True)) == (cpu, cuda)


def test_policy_round_trips_through_the_environment():
    policy = GuardPolicy(on_nan="stop", clip_grad=0.5, desync_every=7)
    assert GuardPolicy.from_env(policy.to_env()) == policy
    assert GuardPolicy.from_env({"DDPTOP_ON_NAN": "bogus", "DDPTOP_CLIP_GRAD": "x"}) == GuardPolicy()


def test_a_one_rank_group_s_non_finite_gradients_are_its_own_without_local_sums():
    grads = [torch.tensor([1.0, math.nan])]
    solo = guard.Gradients(grads, grads, solo=True)
    assert guard.verdict_late(solo, [], None) == {"nonfinite": True, "local_nonfinite": True}
    assert solo.local_nonfinite([]) is True
    assert guard.Gradients.of(grads).local_nonfinite([]) is None, "without DDP, and not alone, nothing is known"
