"""Values that live on the GPU, read a step late so nothing synchronises.

Reading a CUDA tensor on the host (`.item()`, `float()`) waits for every
kernel queued before it: one such read per step would serialise the host
and the device. Instead, a value is copied to pinned host memory
asynchronously with an event behind it, and read once the event has
passed, usually by the next step. On the CPU the value is read at once.

Nothing here imports torch at module level: this is only reached from hooks
that run after the script imported torch itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Late(Protocol):
    """A value that may not be readable yet without waiting; one that reads
    as None leaves its field out of the record."""

    def ready(self) -> bool: ...

    def get(self) -> Any: ...


_PINNED: dict[tuple[Any, Any], list[Any]] = {}
"""Pinned host buffers by (shape, dtype), free for the next late value.
Allocating pinned memory can wait for the device (cudaHostAlloc), so a
rank allocates a handful once and reuses them every step."""


class LateTensor:
    """A small CUDA tensor on its way to the host, in its own dtype (a float
    loss, an integer checksum, the guard's verdict); read as a number, or as
    a list for more than one element."""

    def __init__(self, tensor: Any) -> None:
        import torch

        free = _PINNED.get((tensor.shape, tensor.dtype))
        self._host = free.pop() if free else torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._host.copy_(tensor.detach(), non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()
        self._value: Any = None

    def ready(self) -> bool:
        return self._host is None or bool(self._event.query())

    def get(self) -> Any:
        """The value, waiting for the copy if it has not passed (only at exit)."""
        if self._host is not None:
            self._event.synchronize()
            self._value = self._host.tolist()
            _PINNED.setdefault((self._host.shape, self._host.dtype), []).append(self._host)
            self._host = None
        return self._value


class Derived:
    """A value computed, once readable, from another late value: several
    fields can share one copy to the host. Computed once, however often read."""

    def __init__(self, source: Late, read: Callable[[Any], Any]) -> None:
        self._source: Late | None = source
        self._read = read
        self._value: Any = None

    def ready(self) -> bool:
        return self._source is None or self._source.ready()

    def get(self) -> Any:
        if self._source is not None:
            self._value = self._read(self._source.get())
            self._source = None
        return self._value


def scalar(value: Any) -> float | Late | None:
    """A float now (CPU tensors, Python numbers, a list of losses) or a Late (CUDA tensors, and Late values as they are)."""
    if value is None or type(value) is float:
        return value
    if type(value) is list:
        return _loss_sum(value)
    if hasattr(value, "is_cuda"):
        if value.is_cuda:
            return LateTensor(value.detach().reshape(()))
        return float(value.item())  # a loss still needs its graph: item() reads it without a copy or a warning
    return value if is_late(value) else float(value)


def losses(values: list[Any]) -> Any:
    """A closed step's backward() values, on the training thread (steps.LOSS): on a GPU, the
    loss tensors summed on the device (on its stream) and on their way to the host, a Late; on
    the CPU their sum, read now (None when none was a loss).

    A CPU step's losses are read on the training thread, not held for the sender's: tensors
    held for another thread and freed there leave the training thread's next steps slower
    (their graphs, and memory its allocator gets back on another thread). In the example's
    step the next backward ran 10 to 17 µs slower so; reading the loss here costs 2 µs
    (bench/inrank.py --lines; docs/benchmarks.md)."""
    if not getattr(values[0], "is_cuda", False):
        return _loss_sum(values)
    total: Any = None
    for value in values:
        if is_loss(value):
            value = value.detach().float().reshape(()) if hasattr(value, "detach") else value
            total = value if total is None else total + value
    return None if total is None else LateTensor(total) if getattr(total, "is_cuda", False) else float(total)


def _loss_sum(values: list[Any]) -> float | None:
    """The sum of a CPU step's backward() values, read; None when none was a loss."""
    read = [float(value.item()) if hasattr(value, "item") else float(value) for value in values if is_loss(value)]
    return sum(read) if read else None


def is_loss(value: Any) -> bool:
    """Whether a backward() value can be a loss: a number, or a one-element real floating-point
    tensor (a non-scalar called with a gradient, an integer or complex one are not)."""
    if not hasattr(value, "numel"):
        return True
    return bool(value.numel() == 1 and value.is_floating_point())


PLAIN = frozenset((int, float, bool, str))
"""The types of a record value that is read already."""


def is_late(value: object) -> bool:
    if type(value) in PLAIN:  # most of a record's values: no attribute lookups that fail
        return False
    return hasattr(value, "ready") and hasattr(value, "get")
