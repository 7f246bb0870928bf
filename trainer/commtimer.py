"""Timing each DDP bucket's all-reduce, and a step's communication from them.

A step's comm time is the union of its buckets' in-flight intervals, not
their sum: buckets overlap with each other and with backward, and a summed
figure could exceed the step itself. On CPU backends (gloo) the intervals
are the host clock's, read when the hook launches the all-reduce and when
its future completes; the callback journals each one (steps.py COMM) and
the sender's thread makes the step's figure of them (host_comm). On CUDA
they come from events recorded on the stream, compared a step late (see
late.py), so timing never synchronises: CommTimer keeps those until the
step closes.
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


def host_comm(spans: list[tuple[float, float, Any]]) -> tuple[float, int]:
    """(comm ms, bytes) of a step's host-clock spans, each (start, end, the bucket's buffer)."""
    if len(spans) == 1:  # one bucket, the usual case for a model under 25 MB
        start, end, buffer = spans[0]
        return (end - start) * 1000.0, int(buffer.nbytes)
    return union_ms([(start, end) for start, end, _ in spans]) * 1000.0, sum(int(buffer.nbytes) for _, _, buffer in spans)


class CommTimer:
    """A step's bucket intervals on a GPU, as CUDA events; the post-hook takes the finished step's.

    begin() records an event on the training thread's stream as the hook
    launches the all-reduce; end() runs in the all-reduce's callback and
    records the other. Each span's size is one append, which is atomic."""

    def __init__(self) -> None:
        self._cuda = CudaSpans()
        self._bytes: list[int] = []

    def begin(self) -> tuple[Any, Any]:
        return self._cuda.begin()

    def end(self, span: tuple[Any, Any], bucket_buffer: Any) -> None:
        CudaSpans.end(span)
        self._bytes.append(bucket_buffer.nbytes)

    def take(self) -> tuple[CudaSpans, int] | None:
        """(comm ms as a late value, bytes) of the step just finished, or None if it sent nothing."""
        if not self._cuda.spans:
            return None
        spans, self._cuda = self._cuda, CudaSpans()
        sizes, self._bytes = self._bytes, []
        return spans, sum(sizes)
