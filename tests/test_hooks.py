"""ddptop's torch hooks in this process: real DDP on gloo at world size 1.

The end-to-end tests see the hooks through whole jobs; these look at what a
single step records against what torch says the gradients are, for the ways
scripts arrange a step (accumulation, no_sync, partial optimizers, their own
clipping, GradScaler). Every global the hooks patch is restored afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import importlib.util
import inspect
import io
import math
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import builders
import pytest
import torch
from norms import flat_of, total_norm
from ops_seen import OpsSeen
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddptop.core.policy import GuardPolicy
from ddptop.trainer import guard, hooks, optimizer_step, patches, sharded_forward, torchapi
from ddptop.trainer.steps import StepTracker


class Records(list[dict[str, Any]]):
    """The step records, and the tracker that emitted them."""

    tracker: StepTracker
    policy: GuardPolicy
    probe: hooks.Probe


@pytest.fixture
def records(gloo_world_of_one: None, request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    """ddptop's hooks installed as in a rank; the step records they emit. The
    rank's policy is the default, or the test's indirect parameter. Afterwards
    torch is as it was: every change goes back through patches.undo()."""
    out = Records()
    tracker = out.tracker = StepTracker(0, emit=out.append)
    out.policy = getattr(request, "param", GuardPolicy())
    out.probe = hooks.install(tracker, out.policy)
    yield out
    tracker.flush()
    patches.undo()


def test_every_change_to_torch_is_listed_and_undone(gloo_world_of_one):
    from torch._dynamo import trace_rules  # imported: ddptop's skip list entry goes in at install, not at its import

    # FSDP2's fully_shard, wherever this torch has it, and FSDP1's class, imported for the same reason.
    fsdp2 = [
        m
        for m in (importlib.import_module(n) for n in sharded_forward.FULLY_SHARD_MODULES if importlib.util.find_spec(n))
        if hasattr(m, "fully_shard")
    ]
    fully_shard = [m.fully_shard for m in fsdp2]
    fsdp1 = importlib.import_module("torch.distributed.fsdp").FullyShardedDataParallel
    fsdp1_methods = {name: vars(fsdp1)[name] for name in ("__init__", "clip_grad_norm_")}
    tensor_parallel = importlib.import_module(sharded_forward.TENSOR_PARALLEL_MODULE)  # likewise
    parallelize_module = tensor_parallel.parallelize_module
    skip_list = list(trace_rules.SKIP_DIRS)
    before = {
        name: getattr(DistributedDataParallel, name) for name in ("__init__", "_call_impl", "forward", "__setstate__", "register_comm_hook")
    }
    originals = (
        torch.autograd.backward,
        torch.distributed.init_process_group,
        torch.nn.DataParallel.forward,
        torch.nn.utils.clip_grad_norm_,
    )
    with_norm = getattr(torch.nn.utils, "clip_grads_with_norm_", None)  # torch 2.6 and later
    hooks.install(StepTracker(0, emit=lambda record: None), GuardPolicy())
    changed = patches.applied()
    assert "torch.nn.utils.clip_grad.clip_grad_norm_" in changed
    assert len(changed) == 15 + (with_norm is not None) + len(fsdp2) + len(fsdp1_methods) + 1, changed
    assert fsdp2 and all(m.fully_shard is not original for m, original in zip(fsdp2, fully_shard))
    assert tensor_parallel.parallelize_module is not parallelize_module
    assert trace_rules.check_file(hooks.__file__).skipped, "torch.compile runs ddptop's hooks untraced"
    assert not any("comm_hook" in change for change in changed), "DDP keeps its own all-reduce"
    assert torch.autograd.backward is not originals[0]
    patches.undo()
    assert patches.applied() == [] and {name: getattr(DistributedDataParallel, name) for name in before} == before
    assert list(trace_rules.SKIP_DIRS) == skip_list and not trace_rules.check_file(hooks.__file__).skipped
    assert [m.fully_shard for m in fsdp2] == fully_shard
    assert getattr(torch.nn.utils, "clip_grads_with_norm_", None) is with_norm
    assert {name: vars(fsdp1)[name] for name in fsdp1_methods} == fsdp1_methods
    assert tensor_parallel.parallelize_module is parallelize_module
    assert (
        torch.autograd.backward,
        torch.distributed.init_process_group,
        torch.nn.DataParallel.forward,
        torch.nn.utils.clip_grad_norm_,
    ) == originals
    optimizer_module = importlib.import_module("torch.optim.optimizer")
    assert not optimizer_module._global_optimizer_pre_hooks and not optimizer_module._global_optimizer_post_hooks


def test_an_inherited_method_replaced_is_inherited_again_after_undo_and_back_in_place_after_suspension():
    class Base:
        def method(self) -> str:
            return "torch's"

    class Child(Base):
        pass

    patches.replace(Child, "method", lambda self: "ddptop's")
    with patches.suspended():
        assert Child().method() == "torch's"
    assert Child().method() == "ddptop's"
    patches.undo()
    assert "method" not in vars(Child) and Child().method() == "torch's"


def test_the_running_torch_has_every_private_name_ddptop_uses():
    assert torchapi.missing() == []


def ddp_model() -> DistributedDataParallel:
    torch.manual_seed(0)
    return DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))


def backward(model: nn.Module, scale: float = 1.0) -> None:
    (model(torch.randn(4, 8)).pow(2).sum() * scale).backward()


def norm_of(params: Any) -> float:
    return total_norm([p.grad for p in params if p.grad is not None])


def last_step(records: Records, model: nn.Module) -> dict[str, Any]:
    records.tracker.flush()  # records are built on the sender's thread (steps.py): send what is held
    return [r for r in records if r["type"] == "step"][-1]


def step_and_check_the_norm(records: list[dict[str, Any]], model: nn.Module, optimizer: Any, params: Any) -> None:
    """optimizer.step(), then: the step's record has the norm of params' gradients before it."""
    expected = norm_of(params)
    optimizer.step()
    assert last_step(records, model)["grad_norm"] == pytest.approx(expected, rel=1e-6)


def test_the_phase_follows_a_step_through_forward_backward_and_optimizer_with_ddps_own_all_reduce(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = records.tracker
    loss = model(torch.randn(4, 8)).pow(2).sum()
    assert tracker.phase == "forward", "the loss is computed after the model's forward, before any backward"
    loss.backward()
    assert tracker.phase == "backward"
    assert model._comm_hooks == [] and model.logger._get_ddp_logging_data().strs_map.get("comm_hook", "") == ""
    optimizer.step()
    assert tracker.phase == "data"


def test_the_norm_is_the_optimizers_gradients_norm_also_of_a_group_added_mid_run(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        backward(model)
        step_and_check_the_norm(records, model, optimizer, model.parameters())


def test_each_step_carries_the_learning_rate_it_was_taken_with(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        backward(model)
        optimizer.step()
        schedule.step()
    records.tracker.flush()
    assert [r["lr"] for r in records if r["type"] == "step"] == [0.1, 0.05, 0.025]


@pytest.mark.parametrize("records", [GuardPolicy(desync_every=3), GuardPolicy(desync_every=0)], indirect=True, ids=["every 3", "off"])
def test_the_parameters_checksum_goes_with_every_nth_step_and_with_none_when_off(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sums = {}
    for step in range(7):
        optimizer.zero_grad()
        backward(model)
        sums[step] = guard.checksum(model.parameters())  # the parameters as the step finds them
        optimizer.step()
    records.tracker.flush()
    taken = {r["step"]: r["checksum"] for r in records if r["type"] == "step" and "checksum" in r}
    every = records.policy.desync_every
    assert taken == ({step: sums[step] for step in (0, 3, 6)} if every else {})


@pytest.mark.parametrize("records", [GuardPolicy(desync_every=1)], indirect=True)
def test_the_checksum_leaves_out_the_parameters_the_script_told_ddp_to_ignore(records):
    """DDP keeps no ignored parameter alike across ranks (TorchRec shards its embedding tables so,
    beside a DDP of the dense layers): comparing one would name a desync that is none."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ["0.weight", "0.bias"])
    model = DistributedDataParallel(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(model)
    kept = guard.checksum(module[2].parameters())
    optimizer.step()
    records.tracker.flush()
    (record,) = [r for r in records if r["type"] == "step"]
    assert record["checksum"] == kept != guard.checksum(module.parameters())


def test_accumulated_steps_report_the_norm_of_the_summed_gradients(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    backward(model)
    backward(model, scale=3.0)  # a second all-reduce in the same step
    step_and_check_the_norm(records, model, optimizer, model.parameters())


def test_a_step_without_an_all_reduce_after_a_scaler_skip_has_its_own_norm(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.randn(4, 8)).pow(2).sum()).backward()
    scaler.step(optimizer)
    optimizer.zero_grad()
    with model.no_sync():
        backward(model, scale=5.0)
    step_and_check_the_norm(records, model, optimizer, model.parameters())


def test_an_optimizer_over_part_of_the_model_gets_the_norm_of_its_own_part(records):
    model = ddp_model()
    head = list(model.module[2].parameters())
    optimizer = torch.optim.SGD(head, lr=0.1)
    backward(model)
    assert norm_of(head) != pytest.approx(norm_of(model.parameters()))
    step_and_check_the_norm(records, model, optimizer, head)


def test_an_optimizer_that_gains_a_param_group_gets_the_norm_of_all_it_steps(records):
    """A group added mid-run (a learned temperature outside the DDP model): the norm
    follows what the optimizer steps, the model's buckets no longer being all of it."""
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(model)
    step_and_check_the_norm(records, model, optimizer, model.parameters())
    temperature = nn.Parameter(torch.tensor(2.0))
    optimizer.add_param_group({"params": [temperature]})
    optimizer.zero_grad()
    (model(torch.randn(4, 8)).pow(2).sum() * temperature).backward()
    step_and_check_the_norm(records, model, optimizer, [*model.parameters(), temperature])


def test_the_norm_is_taken_before_the_scripts_own_clipping_which_is_left_alone(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(model, scale=100.0)
    expected = norm_of(model.parameters())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    clipped = [p.grad.clone() for p in model.parameters()]
    optimizer.step()
    assert last_step(records, model)["grad_norm"] == pytest.approx(expected, rel=1e-6)
    assert expected > 1.0
    assert all(torch.equal(c, p.grad) for c, p in zip(clipped, model.parameters()))


def test_the_scripts_clip_norm_is_the_guards_only_where_it_measured_every_gradient_stepped(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first, last = model.module[0], model.module[2]
    backward(model)
    returned = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    with OpsSeen() as seen:
        optimizer.step()
    assert "aten._foreach_norm.Scalar" not in seen.names, "the script's norm of every gradient is the step's"
    assert last_step(records, model)["grad_norm"] == pytest.approx(returned.item(), rel=1e-6)
    for clipped, poisoned in ((model.parameters(), first), (first.parameters(), last)):
        optimizer.zero_grad()
        backward(model)
        poisoned.weight.grad[0, 0] = math.nan
        before = [p.detach().clone() for p in model.parameters()]
        torch.nn.utils.clip_grad_norm_(clipped, 1e9)
        with OpsSeen() as seen:
            optimizer.step()
        record = last_step(records, model)
        assert record["nonfinite"] and record["skipped"] == "nan", record
        assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert "aten._foreach_norm.Scalar" in seen.names, "a clip of some gradients: the guard takes its own norm"


def test_a_grad_scaler_step_reports_the_unscaled_norm(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(model(torch.randn(4, 8)).pow(2).sum()).backward()
    scaler.unscale_(optimizer)
    expected = norm_of(model.parameters())
    scaler.step(optimizer)
    scaler.update()
    assert last_step(records, model)["grad_norm"] == pytest.approx(expected, rel=1e-6)


AMP_STYLES = {
    # minGPT-ddp: clips the gradients of the scaled loss, never unscale_s them: the script's own
    # norm is the scaled one, and the optimizer applies gradients clipped to 1/scale.
    "amp, no unscale_": (True, False),
    # the PyTorch AMP recipe and Hugging Face: unscale_, then clip.
    "amp, unscale_": (True, True),
    # nanoGPT on a CPU or in bf16: GradScaler(enabled=False), its calls no-ops.
    "disabled scaler": (False, True),
}


@pytest.mark.parametrize("records", [GuardPolicy(), GuardPolicy(clip_grad=0.5)], indirect=True, ids=["script clips", "ddptop clips too"])
@pytest.mark.parametrize("style", list(AMP_STYLES))
def test_the_norm_is_the_unscaled_one_before_the_scripts_own_clipping_under_a_grad_scaler(records, style):
    """GRAD NORM is what the script's clip_grad_norm_ returns, unscaled, on every step."""
    enabled, unscales = AMP_STYLES[style]
    model = ddp_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, enabled=enabled)
    expected: list[float] = []
    for _ in range(4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).pow(2).sum() * 10
        scaler.scale(loss).backward()
        if unscales:
            scaler.unscale_(optimizer)
        returned = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        expected.append(returned if unscales else returned / scaler.get_scale())
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    records.tracker.flush()
    shown = [r["grad_norm"] for r in records if r["type"] == "step"]
    assert min(expected) > 1.0, "the script's clipping must have clipped for the test to mean anything"
    assert shown == pytest.approx(expected, rel=1e-4)


def test_a_script_that_restores_its_own_optimizer_state_goes_on_from_its_step_count(records, monkeypatch):
    """nanoGPT's ckpt.pt, a Trainer's resume: the optimizer's step count is where the script goes on."""
    model = ddp_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = {key: value for key, value in optimizer.state_dict().items()}
    saved["state"] = {
        i: {"step": torch.tensor(40.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        for i, p in enumerate(model.parameters())
    }
    optimizer.load_state_dict(saved)  # as `optimizer.load_state_dict(checkpoint["optimizer"])` does
    expected = []
    for _ in range(2):
        backward(model)
        expected.append(norm_of(model.parameters()))
        optimizer.step()
        optimizer.zero_grad()
    records.tracker.flush()
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == [40, 41]
    assert [r["grad_norm"] for r in steps] == pytest.approx(expected, rel=1e-6)
    [resumed] = [r for r in records if r["type"] == "resume"]
    assert resumed["step"] == 39 and resumed["path"] == optimizer_step.RESUMED_FROM


def test_a_non_finite_step_is_skipped_and_this_rank_named_by_its_loss(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    backward(model, scale=math.inf)
    optimizer.step()
    record = last_step(records, model)
    assert record["nonfinite"] and record["local_nonfinite"] and record["skipped"] == "nan"
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_a_finite_cpu_step_is_read_at_once_and_decoded_off_the_training_thread(records):
    """The training thread reads a CPU step's pack (the verdict needs it now) but leaves making the
    record's fields of it to the sender's thread (late.Read): Python it need not run cold."""
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(model)
    expected = norm_of(model.parameters())
    decoded: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is guard.Layout.fields.__code__:
            decoded.append(threading.current_thread().name)

    sys.setprofile(profile)
    try:
        optimizer.step()
    finally:
        sys.setprofile(None)
    assert decoded == []
    assert last_step(records, model)["grad_norm"] == pytest.approx(expected, rel=1e-6)


def test_a_model_whose_ddp_registers_a_comm_hook_in_its_constructor_is_built(records):
    """DDP's mixed precision registers its own comm hook inside __init__,
    before the wrapped __init__ has seen the model. (Its forward needs CUDA
    events, so on the CPU only the construction can be tried.)"""
    from torch.nn.parallel.distributed import _MixedPrecision

    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 4) and not torch.cuda.is_available():
        pytest.skip("torch 2.3's DDP makes CUDA streams for mixed precision in its constructor")
    model = DistributedDataParallel(nn.Linear(8, 2), mixed_precision=_MixedPrecision(param_dtype=torch.bfloat16))
    assert model._comm_hooks


def test_a_comm_hook_the_script_registers_is_ddps_alone_and_the_norm_is_of_what_it_made(records):
    """ddptop registers no comm hook, so a script's goes in as under plain DDP, at any
    step, and DDP's checks and its one-hook rule are its own."""
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(model)
    optimizer.step()
    calls: list[object] = []

    def doubling_hook(state, bucket):  # type: ignore[no-untyped-def]
        calls.append(state)
        return _done(bucket.buffer() * 2)

    model.register_comm_hook("the script's state", doubling_hook)
    assert model._comm_hooks == [(doubling_hook, "the script's state")]
    optimizer.zero_grad()
    torch.manual_seed(1)
    backward(model)
    doubled = [p.grad.clone() for p in model.parameters()]
    optimizer.zero_grad()
    torch.manual_seed(1)
    with model.no_sync():
        backward(model)
    assert calls == ["the script's state"]
    assert all(torch.equal(d, 2 * p.grad) for d, p in zip(doubled, model.parameters()))
    for p, d in zip(model.parameters(), doubled):
        p.grad = d
    step_and_check_the_norm(records, model, optimizer, model.parameters())
    with pytest.raises(RuntimeError, match="can only be called once"):
        model.register_comm_hook(None, doubling_hook)


def _done(tensor: torch.Tensor) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(tensor)
    return future


def test_a_copy_or_pickle_of_a_model_works_as_under_plain_ddp_and_a_copy_is_measured_too(records):
    """Nothing of ddptop's is stored on a model (its probe neither copies nor
    pickles); the script's own hooks must come along."""
    model = ddp_model()
    model.forwards = 0
    model.register_forward_hook(count_forward)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(model)
    optimizer.step()
    torch.save(model, io.BytesIO())
    twin = copy.deepcopy(model)
    assert twin._comm_hooks == [] and twin.forwards == 1
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    backward(twin)
    twin_optimizer.step()
    assert twin.forwards == 2
    assert [ref() for ref in records.probe.models] == [model, twin]


def count_forward(module: nn.Module, args: tuple, output: Any) -> None:
    """A script's own forward hook: a module-level function, so it pickles."""
    module.forwards += 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.distributed.optim imports torch.jit
def test_an_optimizer_stepped_inside_another_is_part_of_its_step(records):
    """ZeroRedundancyOptimizer.step() steps a local optimizer inside its own:
    one training step, one record, with the norm of all the gradients."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = ddp_model()
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        backward(model)
        expected = norm_of(model.parameters())
        optimizer.step()
    record = last_step(records, model)
    assert [r["step"] for r in records if r["type"] == "step"] == [0, 1, 2]
    assert record["grad_norm"] == pytest.approx(expected, rel=1e-6)


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids))


def test_the_loss_is_what_backward_was_called_on_summed_over_accumulation_and_tokens_are_counted(records):
    torch.manual_seed(0)
    model = DistributedDataParallel(TokenModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = 0.0
    for micro in range(3):
        ids = torch.randint(0, 16, (4, 5))
        with model.no_sync() if micro < 2 else contextlib.nullcontext():
            loss = model(input_ids=ids).logsumexp(-1).mean() / 3
            expected += float(loss.detach())
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    records.tracker.flush()
    record = [r for r in records if r["type"] == "step"][-1]
    assert record["loss"] == expected and record["tokens"] == 3 * 4 * 5


def test_two_ddp_models_in_a_step_count_its_samples_once_by_the_model_that_began_it(records):
    """A GAN's steps: the discriminator's on a real and a generated batch (the generator's
    forward in between is the same samples), then the generator's through the discriminator."""
    torch.manual_seed(0)
    generator = DistributedDataParallel(nn.Linear(4, 8))
    discriminator = DistributedDataParallel(nn.Linear(8, 1))
    d_opt = torch.optim.SGD(discriminator.parameters(), lr=0.1)
    g_opt = torch.optim.SGD(generator.parameters(), lr=0.1)
    real = discriminator(torch.randn(16, 8)).mean()
    (real - discriminator(generator(torch.randn(16, 4)).detach()).mean()).backward()
    d_opt.step()
    discriminator(generator(torch.randn(16, 4))).mean().backward()
    g_opt.step()
    records.tracker.flush()
    assert [r["samples"] for r in records if r["type"] == "step"] == [32, 16]


def test_a_grad_scaler_s_loss_is_recorded_unscaled(records):
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    record = last_step(records, model)
    assert record["loss"] == float(loss.detach()) and "tokens" not in record  # float inputs are no tokens


def test_what_is_not_a_step_s_loss_records_none_and_monitor_step_wins(records):
    from ddptop.trainer import monitor

    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    outside = nn.Linear(8, 1)
    outside(torch.randn(2, 8)).sum().backward()  # before any DDP forward of the step: not its loss
    out = model(torch.randn(4, 8))
    out.backward(torch.ones_like(out))  # non-scalar, with a gradient: no loss for it
    with pytest.raises(RuntimeError):
        torch.ones(3, requires_grad=True).sum().long().backward()  # an integer loss raises, as without ddptop
    optimizer.step()
    assert "loss" not in last_step(records, model)

    tracker = StepTracker(0, emit=records.append)
    monitor.bind(tracker)
    try:
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        monitor.step(loss=123.0)
    finally:
        monitor.bind(None)
    tracker.flush()
    assert [r for r in records if r["type"] == "step"][-1]["loss"] == 123.0


def test_a_step_given_a_closure_is_guarded_after_the_closure_made_its_gradients(records):
    """PyTorch Lightning steps its optimizer with a closure that runs the forward and backward
    inside step(): the guard must see those gradients, and the loss is the closure's too."""
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    made: list[tuple[float, float]] = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        made.append((float(loss.detach()), norm_of(model.parameters())))
        return loss

    optimizer.step(closure)
    optimizer.step(closure=closure)
    records.tracker.flush()
    steps = [r for r in records if r["type"] == "step"]
    assert [(r["loss"], r.get("grad_norm")) for r in steps] == [pytest.approx(pair, rel=1e-6) for pair in made], steps


def test_a_compiled_ddp_model_and_optimizer_step_are_measured_and_ddptop_adds_no_recompile_or_warning(records):
    """torch.compile(DDP(model)), as PyTorch's DDP notes write it, and a compiled optimizer step,
    as its tutorial does: dynamo must not trace ddptop's hooks. Traced, the forward wrapper's clock
    breaks the graph (with a UserWarning in the rank's log) and its forward count recompiles it
    every forward, and the guard's step count recompiles the optimizer's. The hooks still measure."""
    import torch._dynamo

    torch._dynamo.reset()
    model = torch.compile(ddp_model(), backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch.compile(optimizer.step, backend="eager")
    expected = []

    def train(steps: int) -> None:
        for _ in range(steps):
            model(torch.randn(4, 8)).pow(2).sum().backward()
            expected.append(norm_of(model.parameters()))
            step()
            optimizer.zero_grad()

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        train(2)  # torch's own recompiles come here (an older torch's SGD recompiles once its state exists)
        with torch._dynamo.config.patch(error_on_recompile=True):
            train(4)
    torch._dynamo.reset()
    assert not [str(w.message) for w in said if "perf_counter" in str(w.message)]
    records.tracker.flush()
    steps = [r for r in records if r["type"] == "step"]
    assert [r["samples"] for r in steps] == [4] * 6 and all("loss" in r for r in steps)
    assert [r["grad_norm"] for r in steps] == pytest.approx(expected, rel=1e-6)


class CheckpointedLoss(nn.Module):
    """A model whose last segment, which makes a scalar, is recomputed in backward by
    torch.utils.checkpoint's reentrant variant: its backward calls torch.autograd.backward."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(lambda h: h.pow(2).mean(), self.layer(x), use_reentrant=True)


def test_a_backward_that_a_backward_runs_adds_nothing_to_the_loss(records):
    torch.manual_seed(0)
    model = DistributedDataParallel(CheckpointedLoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 8)) * 3.0
    loss.backward()
    optimizer.step()
    assert last_step(records, model)["loss"] == pytest.approx(loss.item(), rel=1e-6)


class SparseEmbeddingModel(nn.Module):
    """A recommender's shape: a sparse embedding (its gradient a sparse COO tensor) and a dense head."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 4, sparse=True)
        self.head = nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids).mean(1))


def test_a_sparse_gradient_is_normed_and_guarded_like_a_dense_one(records):
    """_foreach_norm takes no sparse tensor: a model with nn.Embedding(sparse=True) must still step,
    with the norm of all its gradients, and a non-finite step be skipped."""
    torch.manual_seed(0)
    model = DistributedDataParallel(SparseEmbeddingModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 50, (6, 5))
    model(ids).pow(2).mean().backward()
    assert model.module.embedding.weight.grad.is_sparse
    expected = math.sqrt(
        sum(float(p.grad.coalesce().values().norm() if p.grad.is_sparse else p.grad.norm()) ** 2 for p in model.parameters())
    )
    optimizer.step()
    assert last_step(records, model)["grad_norm"] == pytest.approx(expected, rel=1e-6)
    optimizer.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    (model(ids).pow(2).mean() * math.inf).backward()
    optimizer.step()
    assert last_step(records, model)["skipped"] == "nan"
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_a_model_under_composable_replicate_has_the_loss_its_backward_was_called_on(records):
    """replicate() makes a DDP of its own but never calls its forward: no DDP forward begins the
    steps, so the loss comes from backward() as in a job with no DDP model."""
    from torch.distributed._composable.replicate import replicate

    torch.manual_seed(0)
    model = replicate(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    records.tracker.flush()
    assert [r["loss"] for r in records if r["type"] == "step"] == pytest.approx(losses, rel=1e-6)


def bucket_view_model() -> DistributedDataParallel:
    """DDP whose gradients are views of its buckets (gradient_as_bucket_view=True): one bucket
    for the first step, which DDP makes anew after it in the order the gradients came (two
    buckets in torch 2.13, one in 2.3, whose first bucket is never under 1 MiB)."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
    return DistributedDataParallel(module, gradient_as_bucket_view=True, bucket_cap_mb=400 / 2**20)


def buckets_of(model: nn.Module) -> int:
    """How many buffers the model's gradients lie in."""
    return len({p.grad.untyped_storage().data_ptr() for p in model.parameters()})


@pytest.mark.parametrize("records", [GuardPolicy(), GuardPolicy(clip_grad=0.5)], indirect=True, ids=["default", "ddptop clips"])
def test_gradients_in_ddps_buckets_are_normed_and_clipped_a_bucket_at_a_time_also_after_ddp_rebuilds_them(records):
    model = bucket_view_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clip = records.policy.clip_grad
    moves = []
    for _ in range(4):
        optimizer.zero_grad()
        backward(model, scale=10.0)
        expected = norm_of(model.parameters())
        factor = 1.0 if clip is None else min(1.0, clip / (expected + guard.CLIP_EPS))
        after = [p.grad * factor for p in model.parameters()]
        with OpsSeen() as seen:
            optimizer.step()
        flat = flat_of(records.probe, optimizer)
        assert len(flat.buffers) == buckets_of(model) < len(flat.at)
        moves.append(flat.moves)
        fused = seen.names.count("aten._foreach_norm.Scalar")
        assert fused == (len(flat.buffers) > 1), "one fused norm of the buckets, or one reduction of the one bucket"
        record = last_step(records, model)
        assert record["grad_norm"] == pytest.approx(expected, rel=1e-6)
        assert record.get("clipped", False) is (clip is not None)
    assert moves == [0, 1, 1, 1], "found again once DDP has rebuilt its buckets, after the first step"
    assert all(torch.allclose(p.grad, a, rtol=1e-6) for p, a in zip(model.parameters(), after)), "clipped as clip_grad_norm_ clips"


def test_a_non_finite_step_in_ddps_buckets_is_skipped_and_the_next_one_normed_by_them_again(records):
    model = bucket_view_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for scale in (1.0, 1.0, math.inf, 2.0):
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad()
        backward(model, scale=scale)
        expected = norm_of(model.parameters())
        optimizer.step()
        record = last_step(records, model)
        if math.isinf(scale):
            assert record["skipped"] == "nan" and all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
        else:
            assert record["grad_norm"] == pytest.approx(expected, rel=1e-6)
    assert len(flat_of(records.probe, optimizer).buffers) == buckets_of(model)


def test_an_optimizer_over_part_of_ddps_buckets_is_normed_a_gradient_at_a_time(records):
    model = bucket_view_model()
    head = list(model.module[4].parameters())
    optimizer = torch.optim.SGD(head, lr=0.1)
    for _ in range(3):
        backward(model)
        step_and_check_the_norm(records, model, optimizer, head)
    assert flat_of(records.probe, optimizer) is None, "its bucket holds gradients it does not step"


def test_the_buckets_an_optimizer_was_normed_by_are_let_go_with_the_optimizer(records):
    model = bucket_view_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(model)
    optimizer.step()
    key = id(optimizer)
    assert flat_of(records.probe, optimizer) is not None
    del optimizer
    gc.collect()
    assert not [look for look in records.probe.gradients if look[0] == key]


class SometimesDeeper(nn.Module):
    """A model whose second layer takes part only when the forward is asked to use it."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, deeper: bool) -> torch.Tensor:
        x = self.first(x)
        return self.second(x) if deeper else x


def test_an_optimizer_whose_gradients_come_and_go_each_step_looks_at_each_set_once(records, monkeypatch):
    torch.manual_seed(0)
    model = DistributedDataParallel(SometimesDeeper(), find_unused_parameters=True, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    looks = []
    found = guard.flat_buffers
    monkeypatch.setattr(guard, "flat_buffers", lambda *args: looks.append(args) or found(*args))
    looked, bucketed = [], []
    for step in range(10):
        optimizer.zero_grad()
        model(torch.randn(4, 8), deeper=step % 2 == 0).pow(2).sum().backward()
        step_and_check_the_norm(records, model, optimizer, model.parameters())
        looked.append(len(looks))
        bucketed.append(flat_of(records.probe, optimizer) is not None)
    assert looked[3] >= 2 and looked[-1] == looked[3], f"each set of gradients looked at once it settled, not every step: {looked}"
    assert bucketed == [True, False] * 5, "the whole set fills its bucket; the first layer's alone does not"


def test_a_script_that_clips_itself_has_its_norm_taken_and_ddps_buckets_let_go(records):
    model = bucket_view_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        backward(model, scale=10.0)
        expected = norm_of(model.parameters())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        optimizer.step()
        assert last_step(records, model)["grad_norm"] == pytest.approx(expected, rel=1e-6)
        assert flat_of(records.probe, optimizer) is None, "no bucket held past DDP's rebuild of them"


@pytest.mark.parametrize("records", [GuardPolicy(bucket_view=True)], indirect=True, ids=["--bucket-view"])
def test_bucket_view_builds_ddp_with_gradients_in_its_buckets_where_the_script_did_not_say(records):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model = DistributedDataParallel(module)
    assert model.gradient_as_bucket_view
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        backward(model)
        step_and_check_the_norm(records, model, optimizer, model.parameters())
    assert len(flat_of(records.probe, optimizer).buffers) == 1, "normed by its one bucket"
    said = DistributedDataParallel(nn.Linear(8, 2), gradient_as_bucket_view=False)
    assert not said.gradient_as_bucket_view, "what the script says stands"
    places = list(inspect.signature(DistributedDataParallel.__init__).parameters)[1:]
    given = [nn.Linear(8, 2), *(inspect.signature(DistributedDataParallel.__init__).parameters[name].default for name in places[1:])]
    at = places.index("gradient_as_bucket_view")
    given[at] = False
    assert not DistributedDataParallel(*given[: at + 1]).gradient_as_bucket_view, "also said by its place"


def test_without_bucket_view_ddp_is_built_as_the_script_says(records):
    assert not DistributedDataParallel(nn.Linear(8, 2)).gradient_as_bucket_view


class SometimesTwo(nn.Module):
    """Two layers, the second used only when asked."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, both: bool) -> torch.Tensor:
        return self.second(self.first(x)) if both else self.first(x)


def test_an_optimizer_whose_gradients_come_and_go_is_watched_for_its_end_once(records):
    """A parameter used on every other step (its gradient None between): the optimizer's count of
    gradients changes each step, and its buckets are found again each time, but its end is watched
    once, not once a step."""
    torch.manual_seed(0)
    model = DistributedDataParallel(SometimesTwo(), gradient_as_bucket_view=True, find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watchers = len(weakref.finalize._registry)  # type: ignore[attr-defined]
    for step in range(6):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(4, 8), step % 2 == 0).pow(2).sum().backward()
        step_and_check_the_norm(records, model, optimizer, model.parameters())
    assert len(weakref.finalize._registry) - watchers == 1  # type: ignore[attr-defined]


def test_a_ddp_wrapper_left_in_eval_mode_by_lightning_s_validation_still_begins_steps(records):
    """Lightning's validation calls eval() on the DDP wrapper and puts back only its module's
    mode: the training after it runs with the wrapper in eval, its model in train mode. Those
    forwards are training: each step keeps its loss and samples. An evaluation (all in eval
    mode, or under no_grad) is not."""
    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 8))  # validation
    model(torch.randn(4, 8))  # in eval mode, with grad: no training forward either
    model.module.train()
    losses = []
    for _ in range(2):
        loss = model(torch.randn(4, 8)).pow(2).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert not model.training and model.module.training
    steps = builders.steps_made(records.tracker, records)
    assert [(r["loss"], r["samples"]) for r in steps] == [(pytest.approx(value), 4) for value in losses]


def test_a_forward_between_steps_that_is_not_training_is_an_evaluation_s_phase(records):
    """A rank validating between steps is shown in "eval", not waiting for "data", and the
    next step's record has the evaluation apart from its data wait; a forward under no_grad
    within a step (a frozen teacher's) leaves the step's phase alone, and is no evaluation."""
    model, teacher = ddp_model(), ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = records.tracker
    backward(model)
    optimizer.step()
    assert tracker.phase == "data"
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 8))
    assert tracker.phase == "eval"
    model.train()
    out = model(torch.randn(4, 8))
    with torch.no_grad():
        teacher(torch.randn(4, 8))
    assert tracker.phase == "forward"
    out.pow(2).sum().backward()
    optimizer.step()
    out = model(torch.randn(4, 8))
    with torch.no_grad():
        teacher(torch.randn(4, 8))
    out.pow(2).sum().backward()
    optimizer.step()
    first, evaluated, taught = builders.steps_made(tracker, records)
    assert "eval_ms" not in first and "eval_ms" not in taught
    assert 0 < evaluated["eval_ms"] <= evaluated["step_ms"] and evaluated["eval_ended"] <= evaluated["wall"]


class Task(nn.Module):
    """A task object holding the model DDP wraps, as Lightning's and timm's evaluators do."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class Heavy(nn.Module):
    """A model whose forward takes measurable time: an evaluation's span is its forwards'."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 2)
        self.square = torch.randn(384, 384)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            self.square @ self.square
        return self.linear(x)


def batches_of(model: nn.Module, batches: int) -> float:
    """The model's forwards on `batches` batches; the ms they took in all."""
    began = time.perf_counter()
    for _ in range(batches):
        model(torch.randn(4, 8))
    return (time.perf_counter() - began) * 1000.0


@pytest.mark.parametrize(
    "through, batches, mode",
    [
        ("the wrapped module", 1, torch.no_grad),
        ("the wrapped module", 3, torch.inference_mode),
        ("an EMA copy", 3, torch.no_grad),
        ("a task object", 1, torch.inference_mode),
        ("DDP", 2, torch.no_grad),
    ],
)
def test_an_evaluation_by_any_model_between_steps_is_eval_time_never_data_wait(records, through, batches, mode):
    """A validation between epochs runs through DDP, the module it wraps, an EMA copy of it or a task
    object holding it, under no_grad or inference_mode: its time is the next step's eval_ms, its
    phase "eval", and the data wait is only what came before and after it."""
    model = DistributedDataParallel(Heavy())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = records.tracker
    evaluated = {
        "the wrapped module": model.module,
        "an EMA copy": copy.deepcopy(model.module),
        "a task object": Task(model.module),
        "DDP": model,
    }[through]
    backward(model)
    optimizer.step()
    evaluated.eval()
    with mode():
        took = batches_of(evaluated, batches)
    assert tracker.phase == "eval"
    evaluated.train()
    backward(model)
    optimizer.step()
    assert tracker.phase == "data"
    first, second = builders.steps_made(tracker, records)[:2]
    assert "eval_ms" not in first
    assert 0 < second["eval_ms"] <= took and second["eval_ended"] <= second["wall"]
    assert second["data_ms"] < 0.5 * second["eval_ms"], (second, "the evaluation is not data wait")
    assert second["data_ms"] + second["eval_ms"] <= second["step_ms"]


def test_an_evaluation_lasts_as_long_as_the_script_s_function_that_runs_it(records):
    """The heartbeat says "eval" while the script's validate() runs (between its batches too), and
    where it runs; once it has returned (the script saving, or ending, after its last
    validation) the rank is no longer evaluating, though no training forward came."""
    from ddptop.trainer import where

    model = ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker, phase = records.tracker, where.Phase()
    looks: list[tuple[str, str]] = []

    def look() -> None:
        seen: list[where.Sample] = []
        asker = threading.Thread(target=lambda: seen.append(where.sample()))
        asker.start()
        asker.join()
        looks.append((phase.of(seen[0], tracker.phase, tracker.step, tracker.eval_code), seen[0].where))

    def validate() -> None:
        model.module.eval()
        with torch.no_grad():
            for _ in range(2):
                model.module(torch.randn(4, 8))
                look()

    backward(model)
    optimizer.step()
    validate()
    look()
    assert [said for said, _ in looks] == ["eval", "eval", "data"]
    assert tracker.eval_code is not None and tracker.eval_code.co_name == "validate"


def test_one_forward_of_another_model_before_the_training_forward_is_the_step_s_preparation(records):
    """A frozen encoder (a diffusion model's VAE, a teacher) run once on each batch before the training
    forward is part of getting the step going, not an evaluation; and the look for one costs the
    training forward nothing: no hook is left on any module once it begins."""
    model, encoder = ddp_model(), nn.Sequential(nn.Linear(8, 8)).eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hooked: list[bool] = []
    model.module.register_forward_pre_hook(
        lambda module, args: hooked.append(bool(torchapi.global_forward_pre_hooks or encoder._forward_hooks or module._forward_pre_hooks))
    )
    for _ in range(3):
        with torch.no_grad():
            x = encoder(torch.randn(4, 8))
        model(x).pow(2).sum().backward()
        optimizer.step()
    steps = builders.steps_made(records.tracker, records)
    assert [("eval_ms" in step) for step in steps] == [False, False, False]
    assert records.tracker.phase == "forward"
    assert hooked == [True, True, True], "the model's own pre-hook is its only one: nothing of ddptop's"


def warned_at(call: Any) -> list[tuple[str, int, str]]:
    """Where each warning the call raised points: file, line, and its category's name."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [(w.filename, w.lineno, w.category.__name__) for w in caught]


class ScalerKwargOptimizer(torch.optim.SGD):
    """An optimizer whose step takes GradScaler's grad_scaler argument: GradScaler.step warns."""

    _step_supports_amp_scaling = True

    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:  # type: ignore[override]
        return super().step(closure)


def test_a_warning_raised_through_ddptop_s_wrappers_names_the_script_s_line_as_without_ddptop(records):
    """torch warns past its own frames to its caller's line: through DDP's constructor, GradScaler's
    step and backward(), ddptop's wrapper is that caller, and must not be named: the warning names
    the line it names with ddptop's patches put back, the script's."""
    inner = nn.Linear(8, 2)
    model = ddp_model()
    optimizer = ScalerKwargOptimizer(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 8)).pow(2).sum()

    def build() -> None:
        DistributedDataParallel(inner, broadcast_buffers=False)

    def step() -> None:
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(model(torch.randn(4, 8)).pow(2).sum()).backward()
        scaler.step(optimizer)

    def backward_deprecated() -> None:
        torch.autograd.backward(model(torch.randn(4, 8)).pow(2).sum(), grad_variables=torch.ones(()))

    loss.backward()
    # broadcast_buffers is deprecated from torch 2.13: an older DDP's constructor raises no warning.
    deprecated_in_ddp = "`broadcast_buffers` is deprecated" in inspect.getsource(DistributedDataParallel.__init__)
    calls = [*([build] if deprecated_in_ddp else []), step, backward_deprecated]
    for call in calls:
        under_ddptop = warned_at(call)
        with patches.suspended():
            plain = warned_at(call)
        assert under_ddptop and under_ddptop == plain, (call.__name__, under_ddptop, plain)
    # Where torch points past its own frames (stacklevel 2: DDP's constructor from 2.13, backward()'s
    # deprecation and GradScaler.step's from 2.4), that is this file's line, not a ddptop wrapper's.
    if deprecated_in_ddp:
        assert {path for path, _, _ in warned_at(build)} == {__file__}


def test_a_warning_ddptop_raises_itself_or_one_no_wrapper_passes_is_left_as_it_is(records):
    def own() -> None:
        warnings.warn("the script's own", UserWarning, stacklevel=1)

    [(path, line, name)] = warned_at(own)
    assert (path, name) == (__file__, "UserWarning") and line == own.__code__.co_firstlineno + 1
    with pytest.raises(TypeError):
        warnings.warn("not a category", category=int, stacklevel=1)  # type: ignore[arg-type]


def test_a_rank_data_parallel_with_part_of_the_job_over_two_models_is_so_with_the_ranks_both_share():
    """A rank whose two models are each data-parallel over part of the job (a stage DDP replicates
    over ranks 0,2,4,6, and a head FSDP shards over ranks 0,4): the ranks that do all its work
    are those both share."""
    probe = hooks.Probe(StepTracker(0, emit=lambda record: None), GuardPolicy())
    assert probe.tracker.replicas is None
    probe.data_parallel_over([6, 0, 4, 2])
    assert probe.tracker.replicas == (0, 2, 4, 6)
    probe.data_parallel_over(iter([4, 0]))
    assert probe.tracker.replicas == (0, 4)
