"""What stands in for a GPU where there is none (CI, this VM): a device queue whose events pass
when a test says the GPU has caught up, and tensors that say they are on a GPU.

Only the shapes ddptop's GPU path reads are faked: a CUDA event's record, query,
synchronize and elapsed_time, and a device's current stream (late.PinnedRing and
collective_spans.DeviceEvents take its event maker and its stream lookup), and a tensor's `is_cuda` (what the guard and late.scalar branch on). The
kernels are the CPU's, and a copy is done when it is queued: what only a device has (a copy
in flight, a wait on the device, pinned memory) is tests/test_cuda.py's, on a real GPU.
"""

from __future__ import annotations

import time

import torch

from ddptop.trainer.collective_spans import DeviceEvents


class Device:
    """Stands in for the GPU's queue: events recorded since the last catch_up() have not passed."""

    def __init__(self) -> None:
        self.queued: list[Event] = []
        self.waits = 0
        self.made = 0
        """Events made: a ring or a timer that reuses its own makes no more."""
        self.current: dict[int, str] = {}
        """Each device's current stream, by the index a tensor's get_device() gives; "default" where unset."""

    def event(self) -> Event:
        self.made += 1
        return Event(self)

    def timing_events(self, capturing: bool = False) -> DeviceEvents:
        """The collective timer's events on this device (collective_spans.DeviceEvents), with a
        CUDA graph being captured all along where capturing."""
        return DeviceEvents(event=self.event, stream=self.stream, capturing=lambda: capturing)

    def stream(self, device: int) -> str:
        """The stream a copy from device is queued on now (torchapi.current_stream's stand-in)."""
        return self.current.get(device, "default")

    def catch_up(self) -> None:
        for event in self.queued:
            event.passed = True
        self.queued.clear()


class Event:
    """A CUDA event's record, query, synchronize and elapsed_time, passed when its Device catches
    up; the time it passed is the host's as it was recorded."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.passed = True
        self.streams: list[str] = []
        """The streams it was recorded on, in turn."""
        self.at = 0.0

    def record(self, stream: str) -> None:
        self.passed = False
        self.streams.append(stream)
        self.at = time.perf_counter()
        self.device.queued.append(self)

    def elapsed_time(self, end: Event) -> float:
        """ms from this event to end; as CUDA does, an error where either has not passed."""
        if not (self.passed and end.passed):
            raise RuntimeError("CUDA error: device not ready")
        return (end.at - self.at) * 1e3

    def query(self) -> bool:
        return self.passed

    def synchronize(self) -> None:
        self.device.waits += 1
        self.device.catch_up()


class OnGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU. torch hands the subclass on to what is computed
    from it, so a model fed one gives a loss on "the GPU", whose backward and norms do too."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def on_gpu(tensor: torch.Tensor) -> OnGpu:
    """tensor, shared, as an OnGpu (a gradient: `p.grad = on_gpu(p.grad)`)."""
    return torch.Tensor._make_subclass(OnGpu, tensor, tensor.requires_grad)
