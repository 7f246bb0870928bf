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


clock = time.perf_counter
"""The host clock of the spans, in seconds."""


class CommTimer:
    """A step's bucket intervals: host-clock spans, or CUDA events; the
    tracker takes the finished step's, in milliseconds.

    The hook runs on the training thread between torch's kernels, where every
    line is paid cold, so a span begins with a clock() read the hook makes
    itself (or a CUDA event, begin_cuda()); end() runs in the all-reduce's callback, on the backend's thread
    for gloo, and files the span with its bucket's size. Each span is one
    append, which is atomic, so callbacks on several threads lose none."""

    def __init__(self) -> None:
        self._wall: list[tuple[float, float, int]] = []
        self._cuda = CudaSpans()
        self._cuda_bytes: list[int] = []

    def begin_cuda(self) -> tuple[Any, Any]:
        """A bucket's all-reduce starts on a GPU's stream: the start of its span, a CUDA event.
        (On the host the span starts at clock(): the hook calls it itself, one call fewer.)"""
        return self._cuda.begin()

    def end(self, span: Any, bucket_buffer: Any) -> None:
        if type(span) is float:
            self._wall.append((span, clock(), bucket_buffer.nbytes))
        else:
            CudaSpans.end(span)
            self._cuda_bytes.append(bucket_buffer.nbytes)

    def take(self) -> tuple[float | CudaSpans, int] | None:
        """(comm ms, bytes) of the step just finished, or None if it sent nothing.

        The milliseconds are a number for host-clock spans, and the CudaSpans
        themselves (a late value, see late.py) for CUDA events.
        """
        if self._cuda.spans:
            spans, self._cuda = self._cuda, CudaSpans()
            sizes, self._cuda_bytes = self._cuda_bytes, []
            return spans, sum(sizes)
        wall = self._wall
        if not wall:
            return None
        self._wall = []
        if len(wall) == 1:  # one bucket, the usual case for a model under 25 MB
            start, end, nbytes = wall[0]
            return (end - start) * 1000.0, nbytes
        return union_ms([(start, end) for start, end, _ in wall]) * 1000.0, sum(nbytes for _, _, nbytes in wall)
