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


class CudaSpans:
    """One step's bucket intervals as CUDA events, readable once they passed."""

    def __init__(self) -> None:
        self.spans: list[tuple[Any, Any]] = []

    def begin(self) -> tuple[Any, Any]:
        import torch

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
    """A step's bucket intervals: host-clock spans in milliseconds, or CUDA
    events; the tracker takes the finished step's. Called in every bucket's
    hook and callback, so the host-clock case is a list and two clock reads."""

    def __init__(self) -> None:
        self._wall: list[list[float]] = []
        self._cuda = CudaSpans()
        self._bytes = 0
        self.last_bytes = 0
        """The size of the bucket begun last."""

    def begin(self, bucket_buffer: Any) -> Any:
        nbytes = self.last_bytes = bucket_buffer.nbytes
        self._bytes += nbytes
        if bucket_buffer.is_cuda:
            return self._cuda.begin()
        span = [time.perf_counter() * 1000.0, 0.0]
        self._wall.append(span)
        return span

    @staticmethod
    def end(span: Any) -> None:
        if type(span) is list:
            span[1] = time.perf_counter() * 1000.0
        else:
            CudaSpans.end(span)

    def take(self) -> tuple[float | CudaSpans, int] | None:
        """(comm ms, bytes) of the step just finished, or None if it sent nothing.

        The milliseconds are a number for host-clock spans, and the CudaSpans
        themselves (a late value, see late.py) for CUDA events.
        """
        nbytes, self._bytes = self._bytes, 0
        if self._cuda.spans:
            spans, self._cuda = self._cuda, CudaSpans()
            self._wall = []
            return spans, nbytes
        wall = self._wall
        if not wall:
            return None
        self._wall = []
        if len(wall) == 1:  # one bucket, the usual case for a model under 25 MB
            start, end = wall[0]
            return (end - start if end else 0.0), nbytes
        return union_ms([(s, e) for s, e in wall if e]), nbytes
