"""A sharded job's collectives, timed on one step about once a second: its comm per mesh
dimension, and the wait in them that is no part of the rank's own work.

FSDP2, HSDP and FSDP1 meet in all-gathers and reduce-scatters, and HSDP's replicas in
all-reduces, that DDP's reducer never times (sampled.py). torch's flight recorder lists
them, but on gloo with no duration, and one read of it holds the GIL for 16 to 25 ms at ddptop's
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
reads of it is not its time, so it is timed on the device instead (collective_spans.py),
and the step's comm is read late, once the GPU has run it. Tensor parallelism's
collectives go by DTensor's functional collectives, which these functions never see. Nor
are those in code that torch.compile traces while they are armed: there a timing function
hands over to torch's at once, so that the graph holds torch's collective as it does
unarmed, with no break in it for a clock dynamo cannot trace.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ddptop.core.wire.records import WORLD_DIMENSION
from ddptop.trainer.collective_spans import DeviceComm, DeviceEvents, Span
from ddptop.trainer.step_comm import StepComm

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

    def __init__(self, clock: Callable[[], float] = time.perf_counter, events: DeviceEvents | None = None) -> None:
        """clock times a collective on the host; events, on a GPU (collective_spans.py)."""
        self._clock = clock
        self._events = events or DeviceEvents()
        self._saved: dict[str, Callable[..., Any]] = {}
        """torch's own functions, while the timing ones stand in for them."""
        self._timing: dict[str, Callable[..., Any]] = {}
        """The timing function of each of torch's, made at the first arm() and put in again at
        each one after (for as long as torch's function is the same): making one is the most
        of what arming would cost."""
        self._timed: list[Timed] = []
        """Each collective on the host since arm(): appended by the thread that calls it (the
        training thread, or autograd's in a backward) and, for one called with async_op, by
        the thread that completes it."""
        self._spans: list[Span] = []
        """Each collective on a GPU since arm(), by the thread that calls it."""

    @property
    def armed(self) -> bool:
        return bool(self._saved)

    def arm(self) -> None:
        """The timing functions stand in for torch's until disarm()."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or self._saved:
            return
        self._timed, self._spans = [], []
        for name, collective in COLLECTIVES.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._saved[name] = original
            timing = self._timing.get(name)
            if timing is None or getattr(timing, "__wrapped__", None) is not original:
                timing = self._timing[name] = self._timing_of(original, collective)
            setattr(dist, name, timing)

    def disarm(self) -> StepComm | DeviceComm:
        """torch's own functions back (each that nobody replaced since), and what the step's
        collectives took: read late (a DeviceComm) where some ran on a GPU."""
        dist = sys.modules["torch.distributed"]
        for name, original in self._saved.items():
            if getattr(dist, name, None) is self._timing[name]:
                setattr(dist, name, original)
        self._saved = {}
        timed, self._timed = self._timed, []
        comm = StepComm()
        for each in list(timed):
            comm.add(each.group, each.op, each.ms, each.waited)
        spans, self._spans = self._spans, []
        return DeviceComm(self._events, comm, spans) if spans else comm

    def _timing_of(self, original: Callable[..., Any], collective: Collective) -> Callable[..., Any]:
        timer, clock, events = self, self._clock, self._events
        compiler = sys.modules["torch"].compiler
        compiling = getattr(compiler, "is_compiling", None) or compiler.is_dynamo_compiling

        @functools.wraps(original)  # torch's name, docstring and signature, for whoever looks at it
        def timing(*args: Any, **kwargs: Any) -> Any:
            if compiling():  # traced by torch.compile: torch's own function goes in its graph, as if unarmed
                return original(*args, **kwargs)
            timed, spans = timer._timed, timer._spans  # the step's lists as it is called: an async one's completion may come after disarm()
            if len(timed) + len(spans) >= TIMED_KEPT:
                return original(*args, **kwargs)
            group = kwargs["group"] if "group" in kwargs else args[collective.group_at] if len(args) > collective.group_at else None
            name = label(group)
            # Where it runs: its first tensor, or the first of its first list of them (inline: this
            # runs for every collective of the timed step, on the training thread).
            tensor = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(tensor, (list, tuple)):
                tensor = tensor[0] if tensor else None
            if getattr(tensor, "is_cuda", False):
                return _on_device(events, spans, original, args, kwargs, tensor, name, collective.op)
            began = clock()
            work = original(*args, **kwargs)
            took = clock() - began
            if work is None:
                timed.append(Timed(name, collective.op, took * 1e3, True))
            else:
                _time_async(work, lambda: timed.append(Timed(name, collective.op, (clock() - began) * 1e3, False)))
            return work

        return timing


def _on_device(
    events: DeviceEvents, spans: list[Span], original: Callable[..., Any], args: Any, kwargs: Any, tensor: Any, group: str, op: str
) -> Any:
    """A collective on a GPU, between two events on the stream current where it is called
    (collective_spans.py); an async one returns its work untimed."""
    device = tensor.get_device()
    try:
        start = events.mark(device)
    except Exception:  # noqa: BLE001 - no event to be had: the collective runs untimed, never a failure of ddptop's
        start = None
    work = original(*args, **kwargs)
    if start is None:
        return work
    try:
        if work is None and (end := events.mark(device)) is not None:
            spans.append(Span(group, op, device, start, end))
        else:
            events.give_back(device, (start,))
    except Exception:  # noqa: BLE001 - as above
        return work
    return work


def _time_async(work: Any, done: Callable[[], None]) -> None:
    """done() once an async collective completes; nothing for a work without a future."""
    try:
        work.get_future().add_done_callback(lambda _: done())
    except Exception:  # noqa: BLE001 - a backend's or a coalescing manager's work without one: never let it reach the training thread
        return
