"""A sharded job's collectives, timed on one step about once a second: its comm per mesh
dimension, and the wait in them that is no part of the rank's own work.

FSDP2, HSDP and FSDP1 meet in all-gathers and reduce-scatters, and HSDP's replicas in
all-reduces, that DDP's reducer never times (sampled.py). torch's flight recorder lists
them, but on gloo with no duration, and one read of it holds the GIL for 16 ms at ddptop's
2,000 entries (docs/benchmarks.md, bench/flight_recorder.py): the training thread would
wait through every read. So the training thread, at the end of a step that sampled.py
picked, swaps torch.distributed's collective functions (COLLECTIVES) for timing ones, and
swaps them back at the end of the next step. Only that step's collectives pass through
ddptop; every other step calls torch's own functions with nothing between.

Each collective is labelled with its process group's mesh dimension: DeviceMesh names a
group it makes "mesh_<dimension>" (init_device_mesh's mesh_dim_names: HSDP's "replicate"
and "shard", torchtitan's "dp_shard"...); a 1-D mesh over the whole job is the default
group, "world". On gloo a collective called without async_op returns once every rank has
entered it and its data moved: its time is the rank's wait in it, so the rank's own work
that step is the step less its data wait and that wait (steps.py, compute_ms). One called
with async_op is timed until its future completes, which gloo marks on its own thread; the
rank waits for it later, where FSDP does, so it adds to the comm time and not the wait.

A collective on CUDA tensors returns once it is queued on a stream: what a host clock
reads of it is not its time, so such a step is not timed. Tensor parallelism's collectives
go by DTensor's functional collectives, which these functions never see.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ddptop.core.wire.records import WORLD_DIMENSION

MESH_PREFIX = "mesh_"
"""How DeviceMesh begins the description of a group it makes, before the dimension's name."""
TIMED_KEPT = 10_000
"""Collectives timed in one step at most: a step that never ends (the rank exits inside it)
keeps the wrappers in place, and what they keep stays bounded."""


@dataclass(frozen=True)
class Collective:
    """A torch.distributed function that a sharded job's collectives go through."""

    op: str
    """What it does, as the rank detail names it."""
    group_at: int
    """The position of its group argument, for a caller that passes it positionally."""


COLLECTIVES = {
    "all_gather_single": Collective("all-gather", 2),
    "all_gather_into_tensor": Collective("all-gather", 2),
    "all_gather": Collective("all-gather", 2),
    "reduce_scatter_single": Collective("reduce-scatter", 3),
    "reduce_scatter_tensor": Collective("reduce-scatter", 3),
    "reduce_scatter": Collective("reduce-scatter", 3),
    "all_reduce": Collective("all-reduce", 2),
}
"""FSDP2's all-gathers (all_gather_single in a recent torch, all_gather_into_tensor in an
older one), its reduce-scatters likewise, and HSDP's all-reduce across replicas; FSDP1's go
by the older names, and on the CPU by the ones of a list of tensors. Those a torch lacks are
left out."""


class Timed(NamedTuple):
    """One collective of the timed step."""

    group: str
    op: str
    ms: float
    waited: bool
    """The rank waited in it where it called it (not async_op)."""


@dataclass
class StepComm:
    """What one timed step's collectives took."""

    wait_ms: float = 0.0
    """Of comm_ms, the collectives the rank waited in where it called them."""
    by_group: dict[str, dict[str, float]] = field(default_factory=dict)
    """ms per mesh dimension, per op: {"shard": {"all-gather": 3.1, "reduce-scatter": 1.2}}."""

    @property
    def comm_ms(self) -> float:
        """All of them, end to end, added up."""
        return sum(sum(ops.values()) for ops in self.by_group.values())

    def add(self, group: str, op: str, ms: float, waited: bool) -> None:
        if waited:
            self.wait_ms += ms
        ops = self.by_group.setdefault(group, {})
        ops[op] = ops.get(op, 0.0) + ms


def label(group: Any) -> str:
    """A process group's mesh dimension (see above), its description otherwise (a torch before
    2.4 describes none: its name then)."""
    desc = str(getattr(group, "group_desc", "") or "")
    if group is None or group is sys.modules["torch.distributed"].group.WORLD:
        return WORLD_DIMENSION
    if desc.startswith(MESH_PREFIX):
        return desc[len(MESH_PREFIX) :]
    return desc if desc and desc != "undefined" else f"group {getattr(group, 'group_name', '?')}"


class CollectiveTimer:
    """Arms the timing functions for one step and disarms them, on the training thread."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._saved: dict[str, Callable[..., Any]] = {}
        """torch's own functions, while the timing ones stand in for them."""
        self._timing: dict[str, Callable[..., Any]] = {}
        self._timed: list[Timed] = []
        """Each collective since arm(): appended by the training thread and, for one called
        with async_op, by the thread that completes it."""

    @property
    def armed(self) -> bool:
        return bool(self._saved)

    def arm(self) -> None:
        """The timing functions stand in for torch's until disarm()."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or self._saved:
            return
        self._timed = []
        for name, collective in COLLECTIVES.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            timing = self._timing_of(original, collective)
            self._saved[name], self._timing[name] = original, timing
            setattr(dist, name, timing)

    def disarm(self) -> StepComm:
        """torch's own functions back (each that nobody replaced since), and what the step's collectives took."""
        dist = sys.modules["torch.distributed"]
        for name, original in self._saved.items():
            if getattr(dist, name, None) is self._timing[name]:
                setattr(dist, name, original)
        self._saved, self._timing = {}, {}
        timed, self._timed = self._timed, []
        comm = StepComm()
        for each in list(timed):
            comm.add(each.group, each.op, each.ms, each.waited)
        return comm

    def _timing_of(self, original: Callable[..., Any], collective: Collective) -> Callable[..., Any]:
        clock, timed = self._clock, self._timed

        def timing(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            work = original(*args, **kwargs)
            took = clock() - began
            if len(timed) >= TIMED_KEPT or (args and getattr(args[0], "is_cuda", False)):
                return work
            group = kwargs["group"] if "group" in kwargs else args[collective.group_at] if len(args) > collective.group_at else None
            name = label(group)
            if work is None:
                timed.append(Timed(name, collective.op, took * 1e3, True))
            else:
                _time_async(work, lambda: timed.append(Timed(name, collective.op, (clock() - began) * 1e3, False)))
            return work

        return timing


def _time_async(work: Any, done: Callable[[], None]) -> None:
    """done() once an async collective completes; nothing for a work without a future."""
    try:
        work.get_future().add_done_callback(lambda _: done())
    except Exception:  # noqa: BLE001 - a backend's or a coalescing manager's work without one: never let it reach the training thread
        return
