"""The timing of a sharded step's collectives (trainer/collective_timer.py), on a real gloo
group of this process alone: what one step's collectives took, labelled by mesh dimension,
and torch's own functions back after it; on a GPU (collective_spans.py), with the stand-in's
events, read late."""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from stand_in_gpu import Device, on_gpu

from ddptop.core.wire.records import WORLD_DIMENSION as WORLD
from ddptop.trainer import functional_timing
from ddptop.trainer.collective_spans import DeviceComm, union_ms
from ddptop.trainer.collective_timer import COLLECTIVES, CollectiveTimer
from ddptop.trainer.step_comm import COMM_WAIT, StepComm
from ddptop.trainer.timed_collectives import StepLog, label


@pytest.fixture
def timer(gloo_world_of_one: None) -> CollectiveTimer:
    return CollectiveTimer()


def test_a_timed_step_adds_up_its_collectives_by_group_and_op_and_puts_torch_s_functions_back(timer):
    own = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    timer.arm()
    assert timer.armed and all(getattr(dist, name) is not function for name, function in own.items())
    x = torch.ones(4)
    dist.all_reduce(x)
    dist.all_reduce(x, group=None)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(torch.empty(4), x)
    comm = timer.disarm()
    assert not timer.armed and {name: getattr(dist, name) for name in own} == own
    assert set(comm.by_group) == {WORLD} and set(comm.by_group[WORLD]) == {"all-reduce", "all-gather"}
    assert comm.comm_ms == pytest.approx(sum(comm.by_group[WORLD].values())) and comm.comm_ms > 0
    assert comm.wait_ms == pytest.approx(comm.comm_ms)  # none was async: the rank waited in each
    # Untimed again: a collective now adds to no step.
    dist.all_reduce(x)
    assert timer.disarm().by_group == {}


def test_an_async_collective_counts_in_the_comm_and_not_in_the_wait(timer):
    timer.arm()
    work = dist.all_reduce(torch.ones(4), async_op=True)
    work.wait()
    comm = timer.disarm()
    assert comm.by_group == {WORLD: {"all-reduce": pytest.approx(comm.comm_ms)}} and comm.comm_ms > 0
    assert comm.wait_ms == 0.0


def test_a_mesh_dimension_s_group_is_named_for_the_dimension(gloo_world_of_one):
    """DeviceMesh describes the group of its dimension "shard" as "mesh_shard" (a world of one
    has no group but the default one to give a dimension: the description is made here)."""
    if "group_desc" not in inspect.signature(dist.new_group).parameters:
        pytest.skip("new_group takes a description since torch 2.4")
    assert label(dist.new_group([0], group_desc="mesh_shard")) == "shard"
    assert label(dist.new_group([0], group_desc="experts")) == "experts"
    assert label(None) == WORLD and label(dist.group.WORLD) == WORLD
    # DTensor's functional collectives name a group by its mesh and dimension.
    from torch.distributed.device_mesh import init_device_mesh

    assert functional_timing.group_label((init_device_mesh("cpu", (1,)), 0)) == WORLD
    assert functional_timing.group_label(dist.new_group([0], group_desc="mesh_tp")) == "tp"
    assert functional_timing.group_label(init_device_mesh("cpu", (1, 1))) == "mesh", "a 2-D mesh passed whole has no one group"


def test_a_function_someone_else_put_in_while_armed_is_left_in_place(timer):
    theirs = dist.all_reduce
    timer.arm()

    def replaced(*args, **kwargs):
        return theirs(*args, **kwargs)

    dist.all_reduce = replaced
    try:
        timer.disarm()
        assert dist.all_reduce is replaced
    finally:
        dist.all_reduce = theirs


@pytest.fixture
def device() -> Device:
    return Device()


@pytest.fixture
def on_device(gloo_world_of_one: None, device: Device) -> CollectiveTimer:
    """A timer whose events are the stand-in GPU's (stand_in_gpu.py): its collectives on tensors
    that say they are on a GPU run on gloo, and are timed by events that pass when the test says."""
    return CollectiveTimer(events=device.timing_events())


def test_collectives_on_a_gpu_are_read_late_once_their_events_pass_and_never_waited_for(on_device, device):
    on_device.arm()
    x = on_gpu(torch.ones(4))
    dist.all_reduce(x)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(on_gpu(torch.empty(4)), x)
    dist.all_reduce(x, async_op=True).wait()  # where its work is waited for no event sees: untimed
    comm = on_device.disarm()
    assert isinstance(comm, DeviceComm) and len(comm.spans) == 2
    assert not comm.ready() and comm.get() is None and device.waits == 0, "read before the device passed it: nothing waits"
    device.catch_up()
    assert comm.ready()
    fields = comm.get()
    assert fields is not None and set(fields["comm_dims"]) == {WORLD}
    assert set(fields["comm_dims"][WORLD]) == {"all-reduce", "all-gather"} and fields["comm_ms"] > 0
    # One after the other on one stream: the time any was in flight is their spans' sum, at most.
    assert 0 < fields[COMM_WAIT] <= fields["comm_ms"] + 1e-9
    assert comm.get() is fields, "read once"


def test_the_events_of_a_timed_step_are_made_once_and_reused(on_device, device):
    for _ in range(3):
        on_device.arm()
        dist.all_reduce(on_gpu(torch.ones(4)))
        comm = on_device.disarm()
        device.catch_up()
        assert isinstance(comm, DeviceComm) and comm.get()
    assert device.made == 2


def test_a_collective_captured_in_a_cuda_graph_runs_untimed(gloo_world_of_one, device):
    timer = CollectiveTimer(events=device.timing_events(capturing=True))
    timer.arm()
    dist.all_reduce(on_gpu(torch.ones(4)))
    assert timer.disarm() == StepComm() and device.made == 0


def test_the_time_in_flight_counts_collectives_that_overlap_once():
    """FSDP's all-gathers and reduce-scatters run on two streams at once."""
    assert union_ms([(0.0, 3.0), (1.0, 2.0), (2.5, 4.0), (6.0, 7.0)]) == 5.0
    assert union_ms([]) == 0.0


def test_a_collective_in_code_torch_compile_traces_goes_in_its_graph_untimed(timer):
    """A timing function traced by torch.compile gets out of the way: torch's collective goes
    in the graph as it does unarmed, with no graph break of its own (nor dynamo's warning about
    the clock it cannot trace). Set against the same code compiled unarmed, since an older
    torch breaks its graph at a collective anyway."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    @torch.compile(backend="eager")
    def step(x):
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    def graph_breaks(armed: bool) -> dict:
        torch._dynamo.reset()
        counters.clear()
        if armed:
            own = dist.all_reduce
            timer.arm()
            assert dist.all_reduce.__wrapped__ is own, "torch's signature and name, for whoever looks"
        assert torch.equal(step(torch.ones(4)), torch.full((4,), 3.0))
        if armed:
            assert timer.disarm().by_group == {}
        return dict(counters["graph_break"])

    assert graph_breaks(armed=True) == graph_breaks(armed=False)


def test_each_arm_puts_in_the_timing_functions_made_at_the_first(timer):
    """Making them is most of what arming costs; one is made again only for a function of
    torch's that someone replaced since."""
    own = dist.all_reduce
    timer.arm()
    first, gather = dist.all_reduce, dist.all_gather_into_tensor
    timer.disarm()
    theirs = dist.all_gather_into_tensor = lambda *args, **kwargs: gather.__wrapped__(*args, **kwargs)
    try:
        timer.arm()
        assert dist.all_reduce is first and first.__wrapped__ is own
        assert dist.all_gather_into_tensor.__wrapped__ is theirs
        timer.disarm()
    finally:
        dist.all_gather_into_tensor = gather.__wrapped__


@pytest.fixture
def mesh(gloo_world_of_one: None):
    """A 1-D mesh over the world of one, as DTensor's functional collectives are given it."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (1,))


def ticks() -> Callable[[], float]:
    """A clock a second on at each reading: a collective's time says how many readings it took."""
    counter = itertools.count()
    return lambda: float(next(counter))


@pytest.mark.filterwarnings("ignore:`torch.distributed._functional_collectives.all_gather_tensor` is deprecated")
def test_tensor_parallelism_s_collectives_are_timed_from_their_launch_to_the_wait_for_their_output(mesh):
    """DTensor's functional collectives return at once, and the rank waits for one where its
    output is first used: a second in the launch and one in the wait, two each; one waited for
    after the step counts its launch alone. The older name of a gather that calls the newer
    counts once."""
    import torch.distributed._functional_collectives as funcol

    own = {name: getattr(funcol, name) for name in (*functional_timing.FUNCTIONAL, functional_timing.WAIT) if hasattr(funcol, name)}
    timer = CollectiveTimer(clock=ticks())
    timer.arm()
    summed = funcol.all_reduce(torch.ones(4), "sum", (mesh, 0))
    assert isinstance(summed, funcol.AsyncCollectiveTensor) and not summed.completed
    assert torch.equal(summed + 1, torch.full((4,), 2.0)), "its first use waits for it"
    funcol.all_gather_tensor(torch.ones(2), 0, (mesh, 0)).wait()
    left = funcol.all_reduce(torch.ones(4), "sum", (mesh, 0))
    comm = timer.disarm()
    left.wait()
    assert {name: getattr(funcol, name) for name in own} == own
    assert comm.by_group == {WORLD: {"all-reduce": 3000.0, "all-gather": 2000.0}}
    assert comm.wait_ms == 5000.0, "the rank waited in each"


def test_a_functional_collective_on_a_gpu_spans_its_launch_to_the_wait_for_it(mesh, device):
    """On a GPU its span runs from an event before the launch to one after the wait, read late.
    (The stand-in GPU's tensors are the CPU's, which funcol's output will not carry: the
    collective itself runs on the plain tensor.)"""
    import torch.distributed._functional_collectives as funcol

    log, events = StepLog(), device.timing_events()
    untraced = lambda: False  # noqa: E731

    def all_reduce_on_the_gpu(tensor, *args):
        return funcol.all_reduce(tensor.as_subclass(torch.Tensor), *args)

    launch = functional_timing.launching(
        all_reduce_on_the_gpu, functional_timing.FUNCTIONAL["all_reduce"], lambda: log, time.perf_counter, events, untraced
    )
    wait = functional_timing.waiting(funcol.wait_tensor, lambda: log, time.perf_counter, events, untraced)
    out = launch(on_gpu(torch.ones(4)), "sum", (mesh, 0))
    assert len(log.launched) == 1 and log.spans == []
    wait(out.elem)
    assert log.launched == {} and [(span.group, span.op) for span in log.spans] == [(WORLD, "all-reduce")]
    comm = log.settle(events)
    assert isinstance(comm, DeviceComm) and comm.get() is None and device.waits == 0
    device.catch_up()
    fields = comm.get()
    assert fields is not None and set(fields["comm_dims"]) == {WORLD} and fields["comm_ms"] > 0


def test_expert_parallelism_s_all_to_alls_are_timed_whichever_way_it_calls_them(mesh):
    """A mixture of experts sends each token to its expert's rank by an all-to-all of
    torch.distributed's or a functional one."""
    import torch.distributed._functional_collectives as funcol

    timer = CollectiveTimer(clock=ticks())
    timer.arm()
    dist.all_to_all_single(torch.empty(4), torch.ones(4))
    funcol.all_to_all_single(torch.ones(4), None, None, (mesh, 0)).wait()
    seconds = 3000.0
    try:
        dist.all_to_all([torch.empty(4)], [torch.ones(4)])
        seconds += 1000.0
    except RuntimeError as error:  # gloo has it of lists of tensors since torch 2.4
        assert "does not support alltoall" in str(error)
    assert timer.disarm().by_group == {WORLD: {"all-to-all": seconds}}


def test_dtensor_s_all_to_all_between_shardings_counts_once(mesh):
    """On gloo DTensor's all-to-all gathers by a functional all-gather, timed as one."""
    placements = pytest.importorskip("torch.distributed.tensor.placement_types")
    if not hasattr(placements, functional_timing.RESHARD):
        pytest.skip("DTensor's all-to-all between shardings came in torch 2.4")
    timer = CollectiveTimer(clock=ticks())
    timer.arm()
    placements.shard_dim_alltoall(torch.ones(4, 4), 0, 1, mesh, 0)  # as Shard calls it, which a mesh of one never does
    assert timer.disarm().by_group == {WORLD: {"all-gather": 2000.0}}


def test_dtensor_s_all_to_all_on_a_gpu_spans_the_op_that_waits_for_its_work(mesh, device):
    """On a GPU DTensor's all-to-all is one op that makes the current stream wait for its work
    before it returns: an event before it and one after it bracket it, read late."""
    log, events = StepLog(), device.timing_events()
    ran = []

    def all_to_all_on_the_gpu(tensor, gather_dim, shard_dim, mesh, mesh_dim):
        ran.append(device.stream(0))
        return tensor

    reshard = functional_timing.resharding(all_to_all_on_the_gpu, lambda: log, events, lambda: False)
    reshard(on_gpu(torch.ones(4)), 0, 1, mesh, 0)
    reshard(torch.ones(4), 0, 1, mesh, 0)
    assert ran == ["default", "default"] and [(span.group, span.op) for span in log.spans] == [(WORLD, "all-to-all")], (
        "on the CPU: DTensor's all-gather's"
    )
    comm = log.settle(events)
    assert isinstance(comm, DeviceComm) and comm.get() is None and device.waits == 0
    device.catch_up()
    fields = comm.get()
    assert fields is not None and set(fields["comm_dims"][WORLD]) == {"all-to-all"}
