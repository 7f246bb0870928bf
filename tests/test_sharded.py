"""ddptop's hooks on a model FSDP2 shards (fully_shard: DTensor parameters and gradients).

ddptop is for DDP jobs, but a script that shards its model must still run
as it does under torchrun, and be shown nothing wrong: the guard cannot pack
a DTensor with plain tensors, a rank's shard is not the gradient's norm, and
ranks' shards differ by design, so they must not be compared for a desync.
These run in this process at world size 1 (one shard, the whole tensor);
tests/test_e2e_real_trainers.py runs two ranks, whose shards differ
(tests/scripts/fsdp2_job.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from hooked import Records, installed
from norms import total_norm
from stand_in_gpu import Device, on_gpu
from support import fully_shard_ignores
from torch import nn

from ddptop.core.policy import GuardPolicy
from ddptop.trainer import guard, patches
from ddptop.trainer.collective_timer import CollectiveTimer
from ddptop.trainer.optimizer_step import SHARDED_NOTICE
from ddptop.trainer.sampled import Sampled
from ddptop.trainer.step_comm import COMM_WAIT
from ddptop.trainer.steps import LOSSES_KEPT

fsdp = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("FSDP2's public fully_shard is torch 2.6's", allow_module_level=True)


@pytest.fixture
def records(gloo_world_of_one: None, request: pytest.FixtureRequest) -> Iterator[Records]:
    """ddptop's hooks installed as in a rank, with the test's policy (indirect), else a checksum
    every step; what they emit."""
    with installed(getattr(request, "param", GuardPolicy(desync_every=1))) as out:
        yield out


def sharded_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    for layer in (model[0], model[2]):
        fsdp.fully_shard(layer)
    fsdp.fully_shard(model)
    return model


def test_a_sharded_step_shows_the_scripts_norm_and_its_loss_and_takes_no_checksum(records):
    model = sharded_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    expected = []
    for _ in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        expected.append((loss.item(), norm.full_tensor().item()))
        optimizer.step()
        optimizer.zero_grad()
    got = [(r["loss"], r["grad_norm"]) for r in records.steps()]
    assert got == [pytest.approx(pair, rel=1e-6) for pair in expected]
    assert not any("checksum" in r for r in records.steps()), "a rank's shards are not the others': nothing to compare"
    assert [r["text"] for r in records if r["type"] == "rank_note"] == [SHARDED_NOTICE]


def test_without_the_scripts_clip_a_sharded_step_tells_its_shards_norm_and_share_not_a_norm(records):
    """A rank's shards are not the gradients: it tells their norm and its share of the norm's
    square, which the supervisor adds up over the ranks (tests/test_e2e_sharded.py on several).
    Here one rank holds every shard: the share is the whole square."""
    model = sharded_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    expected = total_norm([p.grad.full_tensor() for p in model.parameters()])
    optimizer.step()
    (record,) = records.steps()
    assert "grad_norm" not in record and "nonfinite" not in record and "loss" in record
    assert record["shard_norm"] == pytest.approx(expected, rel=1e-6)
    assert record["grad_sq_share"] == pytest.approx(expected**2, rel=1e-6)


def test_a_non_finite_sharded_step_is_reported_and_not_skipped(records):
    """Skipping on the ranks whose shards went non-finite alone would leave them a step apart
    from the others: where no rank took the global norm, the step is reported (the supervisor's
    --on-nan restart or stop still act)."""
    model = sharded_model()
    before = non_finite_step(model, script_clips=False)
    (record,) = records.steps()
    assert record["nonfinite"] and record["sharded"] and "skipped" not in record
    assert not all(torch.equal(b, p.full_tensor()) for b, p in zip(before, model.parameters()))


def non_finite_step(model: nn.Module, script_clips: bool) -> list[torch.Tensor]:
    """One step of model whose loss is infinite, the script clipping or not; its parameters before."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    before = [p.full_tensor().clone() for p in model.parameters()]
    (model(torch.randn(4, 8)).pow(2).mean() * math.inf).backward()
    if script_clips:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return before


@pytest.mark.parametrize(
    ("records", "script_clips"),
    [(GuardPolicy(desync_every=1), True), (GuardPolicy(clip_grad=0.5), False)],
    indirect=["records"],
    ids=["the script's clip", "--clip-grad"],
)
def test_a_non_finite_sharded_step_is_skipped_where_its_norm_is_every_rank_s(records, script_clips):
    """The script's clip_grad_norm_ on DTensors, or --clip-grad's, reduces the norm over the
    ranks: every rank reads the same verdict, so each skips the step alike, at no cost of ddptop's."""
    model = sharded_model()
    before = non_finite_step(model, script_clips)
    (record,) = records.steps()
    assert record["nonfinite"] and record["sharded"] and record["skipped"] == "nan", record
    assert all(torch.equal(b, p.full_tensor()) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize("records", [GuardPolicy(clip_grad=0.5)], indirect=True)
def test_clip_grad_clips_sharded_gradients_by_their_global_norm_as_torch_does(records):
    model = sharded_model()
    twin = sharded_model()  # the same seed: the same parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    with patches.suspended():
        twin(x).pow(2).sum().backward()
        torch_norm = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5).full_tensor().item()
    model(x).pow(2).sum().backward()
    seen: list[torch.Tensor] = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.extend(p.grad.full_tensor().clone() for p in model.parameters()))
    optimizer.step()
    (record,) = records.steps()
    assert record["grad_norm"] == pytest.approx(torch_norm, rel=1e-6) and record["clipped"] and torch_norm > 0.5
    assert all(torch.allclose(got, p.grad.full_tensor()) for got, p in zip(seen, twin.parameters()))


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded model", "no model ddptop knows"])
def test_a_loop_that_no_optimizer_closes_holds_a_bounded_number_of_losses(records, sharded):
    """What backward() is called on is held until an optimizer step closes the step: a loop that
    never steps a torch optimizer (nor calls monitor.step) must not hold every loss it ever made,
    whether a forward begins its steps (a sharded model's) or none does (a plain module)."""
    model = sharded_model() if sharded else nn.Linear(8, 2)
    for _ in range(LOSSES_KEPT + 10):
        model(torch.randn(2, 8)).sum().backward()
    assert 0 < len(records.tracker.losses) <= LOSSES_KEPT


def test_the_checksum_compares_replicated_dtensors_and_leaves_sharded_ones_out(gloo_world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    plain = torch.randn(4, 4)
    whole = distribute_tensor(plain, mesh, [Replicate()])
    split = distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)])
    assert guard.checksum([whole, split]) == guard.checksum([plain]) is not None
    assert guard.checksum([split]) is None


class UnshardedRoot(nn.Module):
    """FSDP2 applied to the layers but not to the root, which keeps a plain parameter of its own,
    registered first: the optimizer's first gradient is a plain tensor, the rest DTensors."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.layer = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.layer(x))) * self.scale


@pytest.mark.parametrize("records", [GuardPolicy(clip_grad=1000.0, desync_every=1)], indirect=True)
def test_a_model_whose_root_fsdp2_left_unsharded_is_guarded_with_all_its_gradients(records):
    torch.manual_seed(0)
    model = UnshardedRoot()
    fsdp.fully_shard(model.layer)
    fsdp.fully_shard(model.head)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    whole = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    optimizer.step()
    (record,) = records.steps()
    assert record["grad_norm"] == pytest.approx(total_norm(whole), rel=1e-6)
    assert "checksum" in record, "the plain parameter is every rank's whole: compared"


@pytest.mark.parametrize("records", [GuardPolicy(desync_every=1)], indirect=True)
def test_a_parameter_fully_shard_was_told_to_ignore_is_compared_with_no_other_rank_s(records):
    """FSDP leaves an ignored parameter to the script, which may give each rank its own (an
    expert of a mixture of experts): comparing it would name a desync that is none."""
    if not fully_shard_ignores():
        pytest.skip("fully_shard takes ignored_params since torch 2.7")
    torch.manual_seed(0)
    model = UnshardedRoot()
    fsdp.fully_shard(model.layer)
    fsdp.fully_shard(model.head)
    fsdp.fully_shard(model, ignored_params={model.scale})
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    (record,) = records.steps()
    assert "grad_sq_share" in record and "checksum" not in record


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids).mean(1))


def test_a_sharded_models_steps_begin_at_its_outermost_forward_with_its_samples_and_tokens(records):
    """No DDP forward begins an FSDP2 job's steps: the outermost sharded module's does, once a
    forward (its layers' forwards inside it add nothing), and the backward comes after it."""
    torch.manual_seed(0)
    model = TokenModel()
    fsdp.fully_shard(model.embedding)
    fsdp.fully_shard(model.head)
    fsdp.fully_shard(model)
    hooked = {name: len(m._forward_pre_hooks) for name, m in (("embedding", model.embedding), ("head", model.head))}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        for _ in range(2):  # two micro-batches a step
            logits = model(torch.randint(0, 32, (3, 5)))
            assert records.tracker.phase == "forward"
            logits.float().pow(2).mean().backward()
            assert records.tracker.phase == "backward"
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        model.eval()
        model(torch.randint(0, 32, (3, 5)))
    assert [(r["samples"], r["tokens"]) for r in records.steps()] == [(6, 30), (6, 30)]
    assert records.tracker.forwards == 5
    assert {"embedding": len(model.embedding._forward_pre_hooks), "head": len(model.head._forward_pre_hooks)} == {
        name: count - 1 for name, count in hooked.items()
    }, "the inner modules keep FSDP's own hooks only"


def steps_all_reducing_their_loss(on: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor) -> None:
    """3 steps of the sharded model whose script all-reduces each step's loss (as it is, or
    `on` a stand-in GPU): at world size 1, FSDP2 gathers nothing, so that is the step's collective."""
    model = sharded_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        dist.all_reduce(on(loss.detach()))
        optimizer.step()
        optimizer.zero_grad()


def test_the_step_after_the_first_sharded_one_carries_its_collectives_and_its_own_work(records):
    """The first sharded step arms the timing of the next one's collectives (trainer/
    collective_timer.py); the one after that, within the second, is not timed. The timed
    step's own work is what its data wait and its wait in the collectives leave. FSDP2 at
    world size 1 gathers nothing: the collective timed is the script's all-reduce of its loss."""
    own = dist.all_reduce
    steps_all_reducing_their_loss()
    first, timed, untimed = records.steps()
    assert "comm_dims" not in first and "comm_dims" not in untimed and "compute_ms" not in untimed
    assert timed["comm_dims"] == {"world": {"all-reduce": pytest.approx(timed["comm_ms"])}} and timed["comm_ms"] > 0
    assert timed["comm_step"] == 1
    assert timed["compute_ms"] == pytest.approx(timed["step_ms"] - timed["data_ms"] - timed["comm_ms"])
    assert dist.all_reduce is own


def test_a_timed_step_s_collectives_on_a_gpu_go_with_its_record_once_the_device_has_run_them(gloo_world_of_one):
    """On a GPU the timed step's collectives are read from events (trainer/collective_spans.py):
    its record waits for them, as for any value read late, and then has its comm and its own
    work. The script's all-reduce of its loss is "on the GPU" here (stand_in_gpu.py)."""
    device = Device()
    sampled = Sampled()
    sampled.collectives = CollectiveTimer(events=device.timing_events())
    with installed(GuardPolicy(), sampled) as records:
        steps_all_reducing_their_loss(on_gpu)
        records.tracker.build()
        assert [r["step"] for r in records if r["type"] == "step"] == [0], "the timed step waits for its events"
        device.catch_up()
        records.tracker.build()
        first, timed, untimed = records.steps()
    assert "comm_dims" not in first and "comm_dims" not in untimed
    assert timed["comm_dims"] == {"world": {"all-reduce": pytest.approx(timed["comm_ms"])}} and timed["comm_ms"] > 0
    assert timed["comm_step"] == 1 and COMM_WAIT not in timed
    assert timed["compute_ms"] == pytest.approx(max(0.0, timed["step_ms"] - timed["data_ms"] - timed["comm_ms"]))


def samples_of_two_steps(model: nn.Module, records: Records) -> list[int]:
    """Each step's samples as its record says, over two steps of a batch of 3."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(3, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [r["samples"] for r in records.steps()]


def test_a_model_tensor_parallelism_alone_splits_begins_its_steps_at_its_outermost_forward(records):
    """torchtitan with no data-parallel degree: parallelize_module, no fully_shard. The module it
    took begins the steps with its batch, as FSDP's outermost does. (A mesh of one rank is this
    rank alone: no batch shared with another.)"""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    parallelize_module(model, init_device_mesh("cpu", (1,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert samples_of_two_steps(model, records) == [3, 3]
    assert records.tracker.batch_shared == 1


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")  # torch's, of RowwiseParallel's output over one rank
def test_a_model_both_tensor_parallelism_and_fsdp2_took_begins_each_step_once(records):
    """torchtitan's 2-D layout gives its root to parallelize_module and to fully_shard: both
    watch it for the first forward, which must pick it once (a second once-only hook, removed
    by the first in the same forward, is still called by torch, without its kwargs)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fsdp.fully_shard(model, mesh=mesh["dp"])
    assert samples_of_two_steps(model, records) == [3, 3]
