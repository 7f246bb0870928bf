"""Timing each DDP bucket's all-reduce, and a step's communication from them.

A step's comm time is the union of its buckets' in-flight intervals, not
their sum: buckets overlap with each other and with backward, and a summed
figure could exceed the step itself. On CPU backends (gloo) the intervals
are wall-clock, taken when the hook launches the all-reduce and when its
future completes. On CUDA they come from events recorded on the stream,
compared a step late (see late.py), so timing never synchronises.
"""

from __future__ import annotations

import time
from typing import Any


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping [start, end] intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum(end - start for start, end in merged)


class WallSpans:
    """One step's bucket intervals on the host clock, in milliseconds."""

    def __init__(self) -> None:
        self.spans: list[list[float]] = []
        self.bytes = 0

    def begin(self, nbytes: int) -> list[float]:
        self.bytes += nbytes
        span = [time.perf_counter() * 1000.0, 0.0]
        self.spans.append(span)
        return span

    @staticmethod
    def end(span: list[float]) -> None:
        span[1] = time.perf_counter() * 1000.0

    def get(self) -> float:
        if len(self.spans) == 1:  # one bucket, the usual case for a model under 25 MB
            start, end = self.spans[0]
            return end - start if end else 0.0
        return union_ms([(s, e) for s, e in self.spans if e])


class CudaSpans:
    """One step's bucket intervals as CUDA events, readable once they passed."""

    def __init__(self) -> None:
        self.spans: list[tuple[Any, Any]] = []
        self.bytes = 0

    def begin(self, nbytes: int) -> tuple[Any, Any]:
        import torch

        self.bytes += nbytes
        span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        span[0].record()
        self.spans.append(span)
        return span

    @staticmethod
    def end(span: tuple[Any, Any]) -> None:
        span[1].record()

    def ready(self) -> bool:
        return all(end.query() for _, end in self.spans)

    def get(self) -> float:
        if not self.spans:
            return 0.0
        origin = self.spans[0][0]
        return union_ms([(origin.elapsed_time(start), origin.elapsed_time(end)) for start, end in self.spans])


class CommTimer:
    """Hands out a fresh span set per step; the tracker takes the finished one."""

    def __init__(self) -> None:
        self._cuda = False
        self._current: WallSpans | CudaSpans = WallSpans()
        self.last_bytes = 0
        """The size of the bucket begun last."""

    def begin(self, bucket_buffer: Any) -> Any:
        cuda = bool(bucket_buffer.is_cuda)
        if cuda != self._cuda:
            self._cuda = cuda
            self._current = CudaSpans() if cuda else WallSpans()
        self.last_bytes = bucket_buffer.nbytes
        return self._current.begin(self.last_bytes)

    def end(self, span: Any) -> None:
        self._current.end(span)

    def take(self) -> tuple[float | CudaSpans, int] | None:
        """(comm ms, bytes) of the step just finished, or None if it sent nothing.

        The milliseconds are a number for wall-clock spans, and the CudaSpans
        themselves (a late value, see late.py) for CUDA events.
        """
        spans = self._current
        if not spans.spans:
            return None
        self._current = CudaSpans() if self._cuda else WallSpans()
        return (spans if isinstance(spans, CudaSpans) else spans.get()), spans.bytes
