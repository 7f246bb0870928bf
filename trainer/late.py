"""Values that live on the GPU, read a step or more late so nothing synchronises.

A step's values travel in one small tensor (the guard's pack), copied into a
slot of a pinned ring with the slot's own event behind it; the sender's
thread reads the slot once its event has passed. On the CPU the value is
read at once and only decoded later (Read). Why the ring is built as it is:
docs/design.md, "reading GPU values late". Nothing here imports torch at
module level: it is only reached from hooks that run after the script
imported torch itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol


class Late(Protocol):
    """A value that may not be readable yet without waiting; one that reads
    as None leaves its field out of the record."""

    def ready(self) -> bool: ...

    def get(self) -> Any: ...


RING_SLOTS = 1024
"""Values of one shape in flight at most: what the sender's thread reads every 0.1 s."""


class _Slot:
    __slots__ = ("event", "flat", "holds", "host")

    def __init__(self, host: Any, flat: Any, event: Any) -> None:
        self.host = host
        self.flat = flat
        """The same memory as one row, made once: what the reader's tolist() takes, with no view a read."""
        self.event = event
        self.holds = -1
        """The number of the value copied in last."""


class PinnedRing:
    """Pinned host buffers, each with a CUDA event, made once per (shape, dtype, device) and reused in turn."""

    def __init__(self, slots: int = RING_SLOTS, event: Callable[[], Any] | None = None, stream: Callable[[int], Any] | None = None) -> None:
        """event makes a slot's event: torch.cuda.Event unless given; stream(device) is the stream
        a copy from that CUDA device is queued on now: torchapi.current_stream unless given.
        Given stand-ins (a CUDA event's record, query and synchronize, and streams, where there
        is no GPU), the buffers are not pinned: the ring's turns and its reused slots are the
        same on either."""
        self._slots = slots
        self._event = event
        self._stream: Callable[[int], Any] = stream or _torch_stream
        self._rings: dict[tuple[Any, Any, int], tuple[list[_Slot], itertools.count[int]]] = {}
        self._numbers = itertools.count()

    def send(self, tensor: Any, decode: Callable[[list[Any]], Any] = lambda values: values) -> RingRead:
        """Start tensor's copy to the host; the Late reads it, flattened to a list, through decode."""
        device = tensor.get_device()
        key = (tensor.shape, tensor.dtype, device)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = (self._make(tensor, device), itertools.count())
        slots, turn = ring
        slot = slots[next(turn) % self._slots]
        number = next(self._numbers)
        slot.holds = number  # before the copy is queued: a read that sees the old number read the old value
        slot.host.copy_(tensor, non_blocking=True)
        slot.event.record(self._stream(device))
        return RingRead([slot, number, decode, None])

    def _make(self, tensor: Any, device: int) -> list[_Slot]:
        """The slots of one shape, dtype and device. A CUDA event belongs to the device it was
        first recorded on, and the copy from a tensor is queued on its own device's current
        stream, not the current device's (a script that never calls set_device has its model
        on cuda:1 and cuda:0 current): so a ring per device, its events recorded there."""
        import torch

        if self._stream is _torch_stream:  # torch is imported by now: the lookup itself from here on
            from ddptop.trainer import torchapi

            self._stream = torchapi.current_stream
        event = self._event or torch.cuda.Event
        block = torch.empty((self._slots, *tensor.shape), dtype=tensor.dtype, pin_memory=self._event is None)
        # Each slot's two views by one op each for all of them (unbind), not an op a slot: the step
        # that first sends a shape makes them, on the training thread.
        rows, flats = block.unbind(0), block.view(self._slots, tensor.numel()).unbind(0)
        slots = [_Slot(host, flat, event()) for host, flat in zip(rows, flats)]
        stream = self._stream(device)
        for slot in slots:
            slot.event.record(stream)  # CUDA makes an event at its first record: all of them now, none in a later step
        return slots


def _torch_stream(device: int) -> Any:
    """A ring's stream lookup until its first slots are made (PinnedRing._make): torchapi's,
    which imports torch, and this module must not before the script has."""
    from ddptop.trainer import torchapi

    return torchapi.current_stream(device)


class RingRead(list[Any]):
    """One value in a ring's slot: ready once the slot's event has passed; None once the slot was reused.

    Made on the training thread every step as `RingRead([slot, number, decode, None])`: a list,
    so that making one runs no Python (no __init__ to call), as late.Read is a tuple. The sender's
    thread reads it: once read, its slot is dropped (None) and the decoded value kept last."""

    __slots__ = ()

    def ready(self) -> bool:
        slot = self[0]
        return slot is None or slot.holds != self[1] or bool(slot.event.query())

    def get(self) -> Any:
        """The value, waiting for the copy if it has not passed (only at exit, or when forced)."""
        slot, number, decode, value = self
        if slot is None:
            return value
        self[0] = None
        if slot.holds != number:
            return None
        # Only a copy still in flight is waited for: synchronize lets the GIL go, and taking
        # it back from the training thread costs both threads a switch, on every read.
        if not slot.event.query():
            slot.event.synchronize()
        values = slot.flat.tolist()
        if slot.holds != number:  # reused while it was read: what was read may be the next value's
            return None
        self[3] = value = decode(values)
        return value


RING = PinnedRing()
"""The rank's ring: every late value of the rank goes through it."""


class Read(tuple[list[Any], Callable[[list[Any]], Any]]):
    """Values read on the host already, which decode makes a record's fields of on the sender's
    thread: `Read((values, decode))`, a CPU step's pack. Decoding is Python that the training
    thread need not run (on the CPU it cost the example's step about 8 us, run cold between
    torch's kernels). Not a Late: nothing waits for it, so the step's record decodes it as it
    is made (steps._record). A tuple, so that making one runs no Python: no __init__ to call."""

    __slots__ = ()

    def get(self) -> Any:
        values, decode = self
        return decode(values)


def scalar(value: Any) -> float | Late | None:
    """A float now (CPU tensors, Python numbers) or a Late (CUDA tensors, and Late values as they are)."""
    if value is None or type(value) is float:
        return value
    if hasattr(value, "is_cuda"):
        if value.is_cuda:
            return RING.send(value.detach().reshape(1), _first)
        return float(value.item())  # a loss still needs its graph: item() reads it without a copy or a warning
    return value if is_late(value) else float(value)


def _first(values: list[Any]) -> Any:
    return values[0]


FIELDS = "fields"
"""The key of a step's Late values that read as a dict: the step record takes its fields from it."""

PLAIN = frozenset((int, float, bool, str))
"""The types of a record value that is read already."""


def is_late(value: object) -> bool:
    if type(value) in PLAIN:  # most of a record's values: no attribute lookups that fail
        return False
    return hasattr(value, "ready") and hasattr(value, "get")
