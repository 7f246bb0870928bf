"""Tensor parallelism's collectives in the timed step: DTensor's functional collectives.

DTensor redistributes a tensor (ColwiseParallel's and RowwiseParallel's inputs and outputs,
SequenceParallel's, a Partial sum made whole) through the functions of
torch.distributed._functional_collectives, which reach the process group in C++ and never
pass by torch.distributed's functions that collective_timer.py times. Each returns at once
with its output in an AsyncCollectiveTensor, and the rank waits for it in wait_tensor where
the output is first used: DTensor at once, the forward's last all-reduce where the loss is
taken. So in the timed step these functions stand in as well: a launch is kept by its
output's storage, and its time is taken when that storage is waited for. On the CPU the
rank's time in the launch and in the wait, which is its wait in the collective, as for
FSDP's; on a GPU, the span between an event before the launch (the collective's stream
waits for the current one) and one after the wait (where the current stream waits for it
in turn).

DTensor's all-to-all from one sharding of a tensor to another is an op of its own, which on
a GPU waits for its work before it returns, as a collective of torch.distributed's called
without async_op does: it is timed as those are (resharding). On the CPU DTensor makes it an
all-gather, timed as one.

Not timed: a functional collective waited for after the step ended (counted at its launch
alone on the CPU), and the *_autograd and coalesced variants of a torch that calls C++ for
them (expert parallelism's all_to_all_single_autograd among them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ddptop.trainer.collective_spans import DeviceEvents
from ddptop.trainer.timed_collectives import Collective, Launched, StepLog, label

MODULE = "torch.distributed._functional_collectives"

FUNCTIONAL = {
    "all_reduce": Collective("all-reduce", 2),
    "all_gather_single": Collective("all-gather", 2),
    "reduce_scatter_single": Collective("reduce-scatter", 3),
    "all_gather_tensor": Collective("all-gather", 2, calls="all_gather_single"),
    "reduce_scatter_tensor": Collective("reduce-scatter", 3, calls="reduce_scatter_single"),
    "all_to_all_single": Collective("all-to-all", 3),
}
"""DTensor's all-reduce (a Partial made Replicate), all-gather (Shard to Replicate) and
reduce-scatter (Partial to Shard): the *_single names of a recent torch, the *_tensor ones of
an older one, which a recent torch keeps as aliases of the former."""

WAIT = "wait_tensor"
"""Where a functional collective's output is waited for (AsyncCollectiveTensor calls it)."""

RESHARD = "shard_dim_alltoall"
"""DTensor's all-to-all from a tensor sharded on one dimension to the same sharded on another."""
RESHARD_MODULES = ("torch.distributed.tensor.placement_types", "torch.distributed._tensor.placement_types")
"""Where Shard calls it from: the public module of a recent torch, the private one of 2.4."""


def group_label(group: Any) -> str:
    """The mesh dimension of a functional collective's group: DTensor passes (mesh, dimension),
    of which the mesh knows the process group; a 1-D mesh, a process group or a group's name
    may be passed too."""
    try:
        if isinstance(group, tuple) and len(group) == 2 and hasattr(group[0], "get_group"):
            return label(group[0].get_group(group[1]))
        if hasattr(group, "get_group"):
            return label(group.get_group())
    except Exception:  # noqa: BLE001 - a mesh that will not say (a 2-D one passed whole): named as such, never a failure
        return "mesh"
    return f"group {group}" if isinstance(group, str) else label(group)


def storage_of(tensor: Any) -> int | None:
    """The address of a tensor's storage, which its views share; None for what has none."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except Exception:  # noqa: BLE001 - not a plain tensor: not one of the step's launches
        return None


def launching(
    original: Callable[..., Any],
    collective: Collective,
    step: Callable[[], StepLog],
    clock: Callable[[], float],
    events: DeviceEvents,
    traced: Callable[[], bool],
) -> Callable[..., Any]:
    """A timing function for a functional collective: its launch kept in the step's log until
    its output is waited for (waiting)."""

    @functools.wraps(original)  # torch's name, docstring and signature, for whoever looks at it
    def timing(*args: Any, **kwargs: Any) -> Any:
        if traced():  # before anything else of ddptop's: dynamo traces all it reaches here
            return original(*args, **kwargs)
        log = step()
        if log.full():
            return original(*args, **kwargs)
        tensor: Any = args[0] if args else kwargs.get("self")
        device = tensor.get_device() if getattr(tensor, "is_cuda", False) else None
        start = None
        if device is not None and (start := events.try_mark(device)) is None:
            return original(*args, **kwargs)
        began = clock()
        out = original(*args, **kwargs)
        launched = Launched(group_label(collective.group_of(args, kwargs)), collective.op, (clock() - began) * 1e3, device, start)
        elem = getattr(out, "elem", None)
        key = storage_of(elem) if elem is not None and not getattr(out, "completed", True) else None
        if key is None:  # waited for already: traced by another mode, or a gather its reshape waited for
            log.done(events, launched, launched.launch_ms)
        else:
            log.launched[key] = launched
        return out

    return timing


def waiting(
    original: Callable[..., Any],
    step: Callable[[], StepLog],
    clock: Callable[[], float],
    events: DeviceEvents,
    traced: Callable[[], bool],
) -> Callable[..., Any]:
    """A timing function for wait_tensor: a launch of the step's, waited for, is timed."""

    @functools.wraps(original)
    def timing(*args: Any, **kwargs: Any) -> Any:
        if traced():
            return original(*args, **kwargs)
        log = step()
        if not log.launched:
            return original(*args, **kwargs)
        key = storage_of(args[0] if args else next(iter(kwargs.values()), None))
        launched = log.launched.pop(key, None) if key is not None else None
        if launched is None:
            return original(*args, **kwargs)
        began = clock()
        out = original(*args, **kwargs)
        log.done(events, launched, launched.launch_ms + (clock() - began) * 1e3)
        return out

    return timing


def resharding(
    original: Callable[..., Any],
    step: Callable[[], StepLog],
    events: DeviceEvents,
    traced: Callable[[], bool],
) -> Callable[..., Any]:
    """A timing function for DTensor's all-to-all between shardings, called (tensor,
    gather_dim, shard_dim, mesh, mesh_dim): on a GPU, between an event before it and one after
    it, where the current stream has waited for its work; on the CPU it hands over at once,
    since DTensor gathers there by a functional all-gather, timed as such (launching)."""

    @functools.wraps(original)
    def timing(*args: Any, **kwargs: Any) -> Any:
        if traced():
            return original(*args, **kwargs)
        tensor: Any = args[0] if args else kwargs.get("input")
        log = step()
        if not getattr(tensor, "is_cuda", False) or log.full():
            return original(*args, **kwargs)
        group = group_label((args[3], args[4]) if len(args) > 4 else (kwargs.get("mesh"), kwargs.get("mesh_dim")))
        return log.bracketed(events, tensor.get_device(), group, "all-to-all", original, args, kwargs, returns_work=False)

    return timing
