"""What the timing functions of a timed step share, whichever collectives they stand in for
(collective_timer.py: torch.distributed's, which FSDP2, HSDP and FSDP1 call;
functional_timing.py: DTensor's functional ones, which tensor parallelism calls): what a
collective is called, its group's mesh dimension, and the step's log of what they timed.
Nothing here imports torch at module level.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ddptop.core.wire.records import WORLD_DIMENSION
from ddptop.trainer.collective_spans import DeviceComm, DeviceEvents, Span
from ddptop.trainer.step_comm import StepComm

MESH_PREFIX = "mesh_"
"""How DeviceMesh begins the description of a group it makes, before the dimension's name."""
TIMED_KEPT = 10_000
"""Collectives timed in one step at most: a step that never ends (the rank exits inside it)
keeps the timing functions in place, and what they keep stays bounded."""


@dataclass(frozen=True)
class Collective:
    """A torch function that a sharded job's collectives go through."""

    op: str
    """What it does, as the rank detail names it."""
    group_at: int
    """The position of its group argument, for a caller that passes it positionally."""
    calls: str | None = None
    """The function of the same module it calls where the torch has one: timed there, not
    twice (a deprecated alias that calls its new name)."""

    def group_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The group a call of it was given, by name or by position; None: the default."""
        if "group" in kwargs:
            return kwargs["group"]
        return args[self.group_at] if len(args) > self.group_at else None


def label(group: Any) -> str:
    """A process group's mesh dimension: DeviceMesh describes a group it makes
    "mesh_<dimension>" (init_device_mesh's mesh_dim_names: HSDP's "replicate" and "shard",
    torchtitan's "dp_shard"...); a 1-D mesh over the whole job is the default group, "world".
    Its description otherwise (a torch before 2.4 describes none: its name then)."""
    desc = str(getattr(group, "group_desc", "") or "")
    if group is None or group is sys.modules["torch.distributed"].group.WORLD:
        return WORLD_DIMENSION
    if desc.startswith(MESH_PREFIX):
        return desc[len(MESH_PREFIX) :]
    return desc if desc and desc != "undefined" else f"group {getattr(group, 'group_name', '?')}"


def tracing() -> Callable[[], bool]:
    """torch.compile's "am I being traced": a timing function traced by it hands over to
    torch's own at once, so that the graph holds torch's collective as it does unarmed, with
    no break in it for a clock dynamo cannot trace."""
    compiler = sys.modules["torch"].compiler
    return getattr(compiler, "is_compiling", None) or compiler.is_dynamo_compiling


class Timed(NamedTuple):
    """One collective of the timed step, timed on the host."""

    group: str
    op: str
    ms: float
    waited: bool
    """The rank waited in it where it called it (not async_op)."""


class Launched(NamedTuple):
    """A functional collective of the timed step, launched and not yet waited for."""

    group: str
    op: str
    launch_ms: float
    """The host's time in its launch."""
    device: int | None
    """The GPU it runs on; None on the CPU."""
    start: Any
    """On a GPU, the event recorded before its launch."""


@dataclass
class StepLog:
    """What the timing functions took of one timed step: appended by the thread that calls a
    collective (the training thread, or autograd's in a backward) and, for one called with
    async_op on the CPU, by the thread that completes it."""

    timed: list[Timed] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    """Each collective on a GPU, between its two events."""
    launched: dict[int, Launched] = field(default_factory=dict)
    """Functional collectives not yet waited for, by the address of their output's storage
    (what torch's own registry of them goes by: a view of the output waits for it too)."""

    def full(self) -> bool:
        return len(self.timed) + len(self.spans) + len(self.launched) >= TIMED_KEPT

    def done(self, events: DeviceEvents, launched: Launched, ms: float) -> None:
        """launched has been waited for, ms after its launch began on the host; on a GPU its
        span ends at an event recorded now, where the stream that waited for it goes on."""
        if launched.device is None:
            self.timed.append(Timed(launched.group, launched.op, ms, True))
        else:
            self.span_ends(events, launched.group, launched.op, launched.device, launched.start)

    def bracketed(
        self, events: DeviceEvents, device: int, group: str, op: str, call: Callable[..., Any], args: Any, kwargs: Any, returns_work: bool
    ) -> Any:
        """call(*args, **kwargs), a collective on a GPU, between two events on the stream current
        where it is called (collective_spans.py). One that returns_work returns a work where it
        was called with async_op, and None where it waited: a work goes untimed, since it is
        waited for where no event sees."""
        start = events.try_mark(device)
        out = call(*args, **kwargs)
        if start is not None:
            if returns_work and out is not None:
                events.give_back(device, (start,))
            else:
                self.span_ends(events, group, op, device, start)
        return out

    def span_ends(self, events: DeviceEvents, group: str, op: str, device: int, start: Any) -> None:
        """A collective on a GPU, begun at the event start, ends now: its span is kept, or its
        start event goes back where no end event can be had."""
        end = events.try_mark(device)
        if end is None:
            events.give_back(device, (start,))
        else:
            self.spans.append(Span(group, op, device, start, end))

    def settle(self, events: DeviceEvents) -> StepComm | DeviceComm:
        """The step's comm: read late (a DeviceComm) where some ran on a GPU. A functional
        collective never waited for in the step counts its launch alone on the host, and not
        at all on a GPU (its start event goes back)."""
        comm = StepComm()
        for each in list(self.timed):
            comm.add(each.group, each.op, each.ms, each.waited)
        for launched in list(self.launched.values()):
            if launched.device is None:
                comm.add(launched.group, launched.op, launched.launch_ms, True)
            else:
                events.give_back(launched.device, (launched.start,))
        return DeviceComm(events, comm, self.spans) if self.spans else comm
