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

from typing import Any, Protocol


class Late(Protocol):
    """A value that may not be readable yet without waiting."""

    def ready(self) -> bool: ...

    def get(self) -> float | int | None: ...


class LateTensorScalar:
    """A one-element CUDA tensor on its way to the host, in its own dtype
    (a float loss, an integer checksum)."""

    def __init__(self, tensor: Any) -> None:
        import torch

        self._host = torch.empty((), dtype=tensor.dtype, pin_memory=True)
        self._host.copy_(tensor.detach().reshape(()), non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def ready(self) -> bool:
        return bool(self._event.query())

    def get(self) -> float | int:
        return self._host.item()


def scalar(value: Any) -> float | Late | None:
    """A float now (CPU tensors, Python numbers) or a Late (CUDA tensors)."""
    if value is None:
        return None
    if hasattr(value, "is_cuda"):
        if value.is_cuda:
            return LateTensorScalar(value)
        return float(value.detach())  # a loss still needs its graph: no warning, no copy
    return float(value)


def is_late(value: object) -> bool:
    return hasattr(value, "ready") and hasattr(value, "get")
