"""The in-rank guard on real tensors and a real optimizer, in this process."""

from __future__ import annotations

import math

import pytest
import torch
from norms import total_norm
from ops_seen import OpsSeen
from torch import nn

from ddptop.core.policy import GuardPolicy
from ddptop.trainer import guard


def model_with_grads(scale: float = 1.0, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    (model(torch.randn(4, 8)).sum() * scale).backward()
    return model


def read(values: list[torch.Tensor], **fields: object) -> dict[str, object]:
    """A pack of per-gradient norms (and what fields say follows them), read as the host reads it."""
    arrangement = {
        "norms": len(values),
        "script_norm": False,
        "script_scaled": False,
        "losses": (),
        "scale": False,
        "grad_scale": False,
        "found_inf": False,
        "checksum": False,
        "clip": None,
        "solo": False,
    }
    arrangement.update(fields)
    return guard.Layout(*arrangement.values()).fields(guard.pack(values).tolist())


def test_the_norm_read_off_the_pack_is_what_clip_grad_norm_returns_and_sees_inf():
    model = model_with_grads()
    grads = [p.grad for p in model.parameters()]
    expected = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
    assert read(guard.norms(grads))["grad_norm"] == pytest.approx(expected, rel=1e-6)
    assert float(guard.total(guard.norms(grads))) == expected, "the device's total is clip_grad_norm_'s, to the bit"
    grads[1].view(-1)[0] = float("inf")
    assert read(guard.norms(grads)) == {"nonfinite": True, "local_nonfinite": None}


def test_an_fp16_gradients_norm_is_taken_in_fp32_and_does_not_overflow():
    big = torch.full((1000,), 60000.0, dtype=torch.float16)
    assert math.isinf(float(torch._foreach_norm([big])[0]))
    assert read(guard.norms([big]))["grad_norm"] == pytest.approx(60000.0 * math.sqrt(1000), rel=1e-3)


def test_clipping_on_the_device_is_clip_grad_norm_s_and_leaves_gradients_under_the_norm_bitwise_alone():
    model, twin = model_with_grads(scale=1e4), model_with_grads(scale=1e4)
    grads = [p.grad for p in model.parameters()]
    guard.clip_on_device(grads, guard.total(guard.norms(grads)), 1.0)
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), twin.parameters()))
    assert read(guard.norms(grads), clip=1.0) == {"grad_norm": pytest.approx(1.0, rel=1e-5), "clipped": False}

    under = [g.clone() for g in grads]
    guard.clip_on_device(under, guard.total(guard.norms(under)), 10.0)
    assert all(torch.equal(a, b) for a, b in zip(under, grads))


def test_clipping_gradients_of_several_devices_scales_each_device_s_as_one_product_would():
    """The per-device path (a model split over GPUs: tests/test_cuda.py where there are two) run on
    one device's gradients: each group scaled by the same factor, to the bit."""
    model, twin = model_with_grads(scale=1e4), model_with_grads(scale=1e4)
    grads, twins = [p.grad for p in model.parameters()], [p.grad for p in twin.parameters()]
    assert not guard.on_several_devices(grads)
    guard.clip_on_device(grads, guard.total(guard.norms(grads)), 1.0, several_devices=True)
    guard.clip_on_device(twins, guard.total(guard.norms(twins)), 1.0)
    assert all(torch.equal(a, b) for a, b in zip(grads, twins)) and not torch.equal(grads[0], model_with_grads(scale=1e4)[0].weight.grad)


def test_the_pack_carries_the_losses_unscaled_the_scripts_norm_and_a_scalers_verdict():
    norms = [torch.tensor(3.0), torch.tensor(4.0)]
    losses = [torch.tensor(2.0), torch.tensor(1024.0)]
    values = [*norms, torch.tensor(40.0), *losses, torch.tensor(256.0)]
    fields = {"norms": 2, "script_norm": True, "script_scaled": True, "losses": (False, True), "scale": True, "clip": 1.0}
    assert read(values, **fields) == {"loss": 6.0, "grad_norm": 40.0 / 256.0, "clipped": True}, "5 > 1: clipped"
    grad_scale = read([torch.tensor(512.0), torch.tensor(256.0), torch.tensor(0.0)], grad_scale=True, found_inf=True, norms=1)
    assert grad_scale == {"grad_norm": 2.0}
    assert read([torch.tensor(math.inf), torch.tensor(256.0), torch.tensor(1.0)], grad_scale=True, found_inf=True, norms=1) == {
        "skipped": "scaler"
    }


@pytest.mark.parametrize(("loss", "solo", "local"), [(math.inf, False, True), (1.0, False, False), (1.0, True, True)])
def test_a_non_finite_step_names_this_rank_by_its_own_loss_or_when_it_trains_alone(loss, solo, local):
    values = [torch.tensor(math.nan), torch.tensor(loss)]
    assert read(values, norms=1, losses=(False,), solo=solo) == {"nonfinite": True, "local_nonfinite": local, "loss": loss}


def test_a_fused_optimizer_handed_found_inf_skips_the_step_exactly():
    model = model_with_grads()
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        optimizer.step()
    except RuntimeError as exc:  # torch before 2.4 fuses on a GPU only
        pytest.skip(f"this torch has no fused AdamW on the CPU: {exc}")
    weights = [p.detach().clone() for p in model.parameters()]
    state = {k: {n: t.clone() for n, t in v.items()} for k, v in optimizer.state.items()}
    next(model.parameters()).grad.view(-1)[0] = math.nan
    norm = guard.total(guard.norms([p.grad for p in model.parameters()]))
    optimizer.found_inf = guard.found_inf(norm, torch.empty((), dtype=torch.float32))
    optimizer.step()
    del optimizer.found_inf
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    for key, values in state.items():
        assert all(torch.equal(values[n], optimizer.state[key][n]) for n in values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_found_inf_is_one_exactly_where_the_norm_is_not_finite_in_two_ops(dtype):
    out = torch.empty((), dtype=torch.float32)
    for value, expected in ((0.0, 0.0), (1.5, 0.0), (torch.finfo(dtype).max, 0.0), (math.inf, 1.0), (-math.inf, 1.0), (math.nan, 1.0)):
        norm = torch.tensor(value, dtype=dtype)
        with OpsSeen() as seen:
            flag = guard.found_inf(norm, out)
        assert flag is out and flag.dtype == torch.float32
        assert flag.item() == expected, value
        assert len(seen.names) == 2, seen.names


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


def test_checksum_is_exact_order_sensitive_and_read_off_the_pack_alike():
    a, b = torch.randn(100), torch.randn(7, 3).to(torch.bfloat16)
    assert guard.checksum([a, b]) == guard.checksum([a.clone(), b.clone()])
    nudged = a.clone()
    nudged[0] = torch.nextafter(nudged[0], torch.tensor(math.inf))
    assert guard.checksum([nudged, b]) != guard.checksum([a, b])
    assert guard.checksum([b, a]) != guard.checksum([a, b])
    assert 0 <= guard.checksum([a, b]) < 1 << 63
    packed = read([torch.tensor(1.0), *guard.checksum_parts([a, b])], checksum=True, norms=1)
    assert packed["checksum"] == guard.checksum([a, b])


@pytest.mark.parametrize(
    "dtype, shape", [(torch.float32, (256, 33)), (torch.bfloat16, (256, 32)), (torch.float16, (256, 33)), (torch.float64, (999,))]
)
def test_a_checksum_copies_no_parameter(dtype: torch.dtype, shape: tuple[int, ...]):
    """Every 100 steps on the training thread, over the whole model: a copy of a parameter (a
    sum into a wider integer makes one, inside the sum's kernel) would take memory a GPU's
    allocator keeps. Only views and sums: torch's profiler sees no allocation of a parameter's
    size, only scalars."""
    tensors = [torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiled:
        guard.checksum_parts(tensors)
    allocated = [(event.name, event.cpu_memory_usage) for event in profiled.events() if event.cpu_memory_usage > 0]
    assert allocated, "the profiler saw no allocation: it cannot tell a copy from none"
    assert max(size for _, size in allocated) < tensors[0].nbytes // 8, allocated
    nudged = tensors[1].clone()
    nudged.view(-1)[-1] = torch.nextafter(nudged.view(-1)[-1], torch.tensor(math.inf, dtype=dtype))
    assert guard.checksum([tensors[0], nudged]) != guard.checksum(tensors)


def test_a_checksum_of_parameters_under_grad_mode_records_no_graph_and_leaves_them_trainable():
    """The checksum runs in the optimizer's pre-hook with grad mode on, over parameters that
    require grad, without detaching them first: the integer view of each takes no part in autograd."""
    model = torch.nn.Linear(8, 4)
    plain = [p.detach().clone() for p in model.parameters()]
    with torch.enable_grad():
        parts = guard.checksum_parts(list(model.parameters()))
    assert all(part.grad_fn is None and not part.requires_grad for part in parts)
    assert guard.checksum(model.parameters()) == guard.checksum(plain)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    assert guard.checksum(model.parameters()) != guard.checksum(plain)


@pytest.mark.parametrize(
    "on_nan, skips, waits_on_cuda",
    [("auto", True, False), ("skip", True, True), ("restart", True, True), ("stop", True, True), ("warn", False, False)],
)
def test_only_an_asked_for_skip_makes_a_gpu_rank_wait_for_the_verdict(on_nan, skips, waits_on_cuda):
    policy = GuardPolicy(on_nan=on_nan)
    assert (policy.skips, policy.waits(cuda=False), policy.waits(cuda=True)) == (skips, False, waits_on_cuda)


def test_policy_round_trips_through_the_environment():
    policy = GuardPolicy(on_nan="stop", clip_grad=0.5, desync_every=7, bucket_view=True)
    assert GuardPolicy.from_env(policy.to_env()) == policy
    assert GuardPolicy.from_env(GuardPolicy().to_env()) == GuardPolicy()
    assert GuardPolicy.from_env({"DDPTOP_ON_NAN": "bogus", "DDPTOP_CLIP_GRAD": "x"}) == GuardPolicy()


def bucketed(grads: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    """grads copied into flat buffers of sizes elements, each a view of its buffer at the next
    offset, as DDP lays out its buckets under gradient_as_bucket_view=True."""
    views, at, buffers = [], 0, [torch.empty(size) for size in sizes]
    buffer = iter(buffers)
    current = next(buffer)
    for grad in grads:
        if at + grad.numel() > current.numel():
            current, at = next(buffer), 0
        views.append(current[at : at + grad.numel()].view_as(grad).copy_(grad))
        at += grad.numel()
    return views


def test_gradients_that_tile_flat_buffers_are_normed_by_the_buffers_as_clip_grad_norm_norms_them():
    grads = [p.grad for p in model_with_grads(scale=3.0).parameters()]  # 128, 16, 32 and 2 elements
    views = bucketed(grads, [144, 34])
    flat = guard.flat_buffers(views)
    assert flat is not None and [b.numel() for b in flat.buffers] == [144, 34]
    assert flat.at == [v.data_ptr() for v in views]
    expected = total_norm(grads)
    assert read(guard.norms(flat.buffers))["grad_norm"] == pytest.approx(expected, rel=1e-6)
    guard.clip_on_device(flat.buffers, guard.total(guard.norms(flat.buffers)), 1.0)
    assert total_norm(views) == pytest.approx(1.0, rel=1e-5), "a buffer clipped is its gradients clipped"


def test_gradients_in_one_buffer_are_normed_by_one_reduction():
    grads = [p.grad for p in model_with_grads(scale=3.0).parameters()]
    flat = guard.flat_buffers(bucketed(grads, [178]))
    assert flat is not None
    with OpsSeen() as seen:
        normed = guard.norms(flat.buffers)
    assert seen.names == ["aten.linalg_vector_norm.default"]
    assert float(normed[0]) == pytest.approx(total_norm(grads), rel=1e-6)


@pytest.mark.parametrize(
    "layout",
    ["each its own", "room for another", "a gap", "an overlap", "a transposed view", "two dtypes"],
)
def test_gradients_that_do_not_tile_their_buffers_exactly_are_not_normed_by_them(layout):
    grads = [p.grad for p in model_with_grads().parameters()]
    if layout == "each its own":  # DDP without gradient_as_bucket_view
        views = grads
    elif layout == "room for another":  # a buffer that also holds a gradient another optimizer steps
        views = bucketed(grads, [200])
    elif layout == "a gap":
        buffer = torch.zeros(180)
        views = [buffer[:128].view(16, 8), buffer[130:146], buffer[146:178].view(2, 16), buffer[178:180]]
    elif layout == "an overlap":
        buffer = torch.zeros(176)
        views = [buffer[:128].view(16, 8), buffer[120:136], buffer[136:168].view(2, 16), buffer[168:170]]
    elif layout == "a transposed view":
        views = bucketed(grads, [178])
        views[0] = views[0].t()
    else:  # one buffer's bytes read as two dtypes
        buffer = torch.zeros(180)
        views = [buffer[:128].view(16, 8), buffer[128:144], buffer[144:176].view(2, 16), buffer[176:180].view(torch.float64)]
    assert guard.flat_buffers(views) is None
