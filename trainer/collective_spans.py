"""A timed sharded step's collectives on a GPU: their spans on the device, read late.

A collective on CUDA tensors returns once it is queued, so a host clock says nothing of
how long it ran. In the one step a second that collective_timer.py times, each collective
called without async_op (how FSDP2, HSDP and FSDP1 call theirs, each on its own stream) is
bracketed by two CUDA events recorded on the stream it runs on or is waited for on: the
stream current where it was called. The sender's thread reads the spans once every end
event has passed (a late.Late), so nothing waits for the GPU.

What it reads: each collective's time on the device, added up per mesh dimension and op
(the COMM column and the rank detail, as on the CPU), and the time the rank had any
collective in flight: the union of the spans, not their sum, because FSDP's all-gathers
and reduce-scatters run on two streams at once. That union is the rank's wait in them
(step_comm.COMM_WAIT), which its own work is taken without (steps.py): a rank that others
wait for spends little of its step in collectives, and they much.

A collective called with async_op is not timed: its work is waited for where the caller
chooses, which no event here can see. Nor is one called while a CUDA graph is captured,
where an event cannot be timed. Nothing here imports torch at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ddptop.trainer.step_comm import COMM_WAIT, StepComm


class Span(NamedTuple):
    """One collective of the timed step on the GPU, between two events on one stream."""

    group: str
    op: str
    device: int
    start: Any
    end: Any


class DeviceEvents:
    """Timing events, kept per device and reused from one timed step to the next (a CUDA event
    belongs to the device it was first recorded on), and the device's current stream.

    event makes one (torch.cuda.Event with timing unless given), stream(device) is the stream
    queued on now (torchapi.current_stream unless given) and capturing() whether a CUDA graph
    is being captured on it: stand-ins for all three where there is no GPU."""

    def __init__(
        self,
        event: Callable[[], Any] | None = None,
        stream: Callable[[int], Any] | None = None,
        capturing: Callable[[], bool] | None = None,
    ) -> None:
        self._event = event
        self._stream = stream
        self._capturing = capturing
        self._free: dict[int, list[Any]] = {}
        """Per device, events read already: taken on the training thread, given back on the sender's."""

    def mark(self, device: int) -> Any:
        """An event recorded now on device's current stream; None during a graph's capture."""
        if self._event is None or self._stream is None or self._capturing is None:
            self._torch_defaults()
        assert self._event is not None and self._stream is not None and self._capturing is not None
        if self._capturing():
            return None
        free = self._free.get(device)
        event = free.pop() if free else self._event()
        event.record(self._stream(device))
        return event

    def try_mark(self, device: int) -> Any:
        """mark(device), or None where no event can be had: the collective then runs untimed,
        never a failure of ddptop's."""
        try:
            return self.mark(device)
        except Exception:  # noqa: BLE001 - see above
            return None

    def give_back(self, device: int, events: Iterable[Any]) -> None:
        self._free.setdefault(device, []).extend(events)

    def _torch_defaults(self) -> None:
        """torch's own, looked up once the script has imported it (a step on CUDA tensors says it has)."""
        import torch

        from ddptop.trainer import torchapi

        self._event = self._event or (lambda: torch.cuda.Event(enable_timing=True))
        self._stream = self._stream or torchapi.current_stream
        self._capturing = self._capturing or torch.cuda.is_current_stream_capturing


@dataclass
class DeviceComm:
    """A timed step's collectives on the GPU, with those timed on the host (a CPU group's) beside
    them: a late.Late that reads as the step's comm fields (StepComm.values) once every
    span has ended on the device, and as None if one cannot be read."""

    events: DeviceEvents
    host: StepComm = field(default_factory=StepComm)
    spans: list[Span] = field(default_factory=list)
    _passed: int = 0
    """Spans whose end has been seen to pass, from the first: those are not asked again."""
    _done: bool = False
    _values: dict[str, Any] | None = None

    def ready(self) -> bool:
        spans = self.spans
        try:
            while self._passed < len(spans) and spans[self._passed].end.query():
                self._passed += 1
        except Exception:  # noqa: BLE001 - a device error is the script's to meet: its comm goes unread (get)
            return True
        return self._passed == len(spans)

    def get(self) -> dict[str, Any] | None:
        if not self._done and self.ready():
            self._done = True
            self._values = self._read()
        return self._values

    def _read(self) -> dict[str, Any] | None:
        comm, spans = self.host, self.spans
        in_flight = 0.0
        try:
            for device in {span.device for span in spans}:
                on = [span for span in spans if span.device == device]
                first = on[0].start  # a device's own clock: each span's start and end taken from one of its events
                intervals = [(first.elapsed_time(span.start), first.elapsed_time(span.end)) for span in on]
                for span, (began, ended) in zip(on, intervals):
                    comm.add(span.group, span.op, ended - began, False)
                in_flight = max(in_flight, union_ms(sorted(intervals)))
        except Exception:  # noqa: BLE001 - an event the device could not time: the step goes without its comm
            return None
        finally:
            for span in spans:
                self.events.give_back(span.device, (span.start, span.end))
        values = comm.values()
        if values:
            values[COMM_WAIT] = comm.wait_ms + in_flight
        return values


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """How long at least one of these (start, end) intervals, sorted by start, was open."""
    total = 0.0
    open_from = open_to = None
    for start, end in intervals:
        if open_to is None or start > open_to:
            if open_from is not None and open_to is not None:
                total += open_to - open_from
            open_from, open_to = start, end
        else:
            open_to = max(open_to, end)
    if open_from is not None and open_to is not None:
        total += open_to - open_from
    return total
