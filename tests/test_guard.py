"""The in-rank guard on real tensors and a real optimizer, in this process."""

from __future__ import annotations

import math

import torch
from torch import nn

from ddptop.trainer import guard
from ddptop.trainer.policy import GuardPolicy


def model_with_grads(scale: float = 1.0, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    (model(torch.randn(4, 8)).sum() * scale).backward()
    return model


def test_grad_norm_matches_torch_and_sees_inf():
    model = model_with_grads()
    grads = [p.grad for p in model.parameters()]
    expected = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
    assert math.isclose(guard.grad_norm(grads), expected, rel_tol=1e-6)
    grads[1].view(-1)[0] = float("inf")
    assert guard.grad_norm(grads) == math.inf
    assert guard.grad_norm([]) is None


def test_clip_enforces_the_norm_and_leaves_clipped_grads_bitwise_alone():
    model = model_with_grads(scale=1e4)
    grads = [p.grad for p in model.parameters()]
    assert guard.clip(grads, guard.grad_norm(grads), 1.0)
    assert guard.grad_norm(grads) <= 1.0 + 1e-6

    script_clipped = model_with_grads(scale=1e4, seed=1)
    torch.nn.utils.clip_grad_norm_(script_clipped.parameters(), 1.0)
    before = [p.grad.clone() for p in script_clipped.parameters()]
    grads = [p.grad for p in script_clipped.parameters()]
    assert not guard.clip(grads, guard.grad_norm(grads), 1.0)
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


def test_policy_round_trips_through_the_environment():
    policy = GuardPolicy(on_nan="stop", clip_grad=0.5, desync_every=7)
    assert GuardPolicy.from_env(policy.to_env()) == policy
    assert GuardPolicy.from_env({"DDPTOP_ON_NAN": "bogus", "DDPTOP_CLIP_GRAD": "x"}) == GuardPolicy()
