"""Rolling statistics over a rank's recent steps.

Windows are bounded (a deque per rank), so memory stays flat however long
the job runs; percentiles are taken over the window by nearest rank, which
needs no interpolation and is exact for the values that were seen.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from ddptop.core.wire.records import WINDOWED

WINDOW = 100
"""Steps per rank that the rolling figures cover."""


def nearest_rank(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of values already sorted; None when empty."""
    if not ordered:
        return None
    index = max(0, math.ceil(q / 100.0 * len(ordered)) - 1)
    return ordered[min(index, len(ordered) - 1)]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of values; None when empty."""
    return nearest_rank(sorted(values), q)


def median(values: list[float]) -> float | None:
    return percentile(values, 50)


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float | None:
    """All-reduce bus bandwidth as nccl-tests defines it: algbw * 2(n-1)/n."""
    if seconds <= 0 or world_size < 1:
        return None
    return nbytes / seconds * 2 * (world_size - 1) / world_size


class StepPoint:
    """One step as a window keeps it: its wall time, step time and the values
    the step record keeps in the window (WINDOWED, wire/records.py), so a new one needs no
    change here. Slots, since a window holds 100 per rank."""

    FIELDS = ("wall", "step_ms", *WINDOWED)
    __slots__ = FIELDS

    def __init__(self, wall: float, step_ms: float, **values: float | None) -> None:
        self.wall = wall
        self.step_ms = step_ms
        for name in WINDOWED:
            setattr(self, name, values.get(name))

    def get(self, name: str) -> float | None:
        """A windowed value by name; None when the step did not carry it."""
        value: float | None = getattr(self, name)
        return value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepPoint) and all(getattr(self, f) == getattr(other, f) for f in self.FIELDS)

    def __repr__(self) -> str:
        return f"StepPoint({', '.join(f'{f}={getattr(self, f)!r}' for f in self.FIELDS)})"


_SUMMED = ("step_ms", *WINDOWED)


class RollingWindow:
    """A rank's last steps, with its figures kept up to date as steps come and go.

    Dashboards ask for every rank's figures several times a second, and at
    64 ranks stepping ten times a second nearly every window changes between
    two refreshes; so the sums behind means and rates are running ones, and
    step times are kept sorted (bisect) for percentiles: a step costs
    O(log n) to add, a figure O(1) to read.
    """

    def __init__(self, size: int = WINDOW) -> None:
        self.points: deque[StepPoint] = deque(maxlen=size)
        self._sums = dict.fromkeys(_SUMMED, 0.0)
        self._counts = dict.fromkeys(_SUMMED, 0)
        self._sorted_step_ms: list[float] = []
        self._sorted_data_ms: list[float] = []
        self.gaps: deque[tuple[float, float]] = deque(maxlen=size)
        """(start, end) wall times left out of the rates (skip()), while they fall in the window."""

    def skip(self, wall: float, ms: float) -> None:
        """The ms up to wall out of the rates' span, the steps around them kept: a step left out
        of the figures (a pause, not added), or an evaluation a step held (JobState), which the
        step held for a pause may hold too."""
        self.gaps.append((wall - ms / 1000.0, wall))

    def add(self, point: StepPoint) -> None:
        while self.gaps and self.points and self.gaps[0][1] <= self.points[0].wall:
            self.gaps.popleft()
        if len(self.points) == self.points.maxlen:
            old = self.points[0]
            self._account(old, -1)
            del self._sorted_step_ms[bisect.bisect_left(self._sorted_step_ms, old.step_ms)]
            if (gone := old.get("data_ms")) is not None:
                del self._sorted_data_ms[bisect.bisect_left(self._sorted_data_ms, gone)]
        self.points.append(point)
        self._account(point, 1)
        bisect.insort(self._sorted_step_ms, point.step_ms)
        if (data := point.get("data_ms")) is not None:
            bisect.insort(self._sorted_data_ms, data)

    def _account(self, point: StepPoint, sign: int) -> None:
        for attr in _SUMMED:
            value = getattr(point, attr)
            if value is not None:
                self._sums[attr] += sign * value
                self._counts[attr] += sign

    def step_ms(self, q: float) -> float | None:
        return nearest_rank(self._sorted_step_ms, q)

    def data_ms(self, q: float) -> float | None:
        """The percentile of the steps' wait for their data; None where no step timed it."""
        return nearest_rank(self._sorted_data_ms, q)

    def mean(self, attr: str) -> float | None:
        count = self._counts[attr]
        return self._sums[attr] / count if count else None

    def rate(self, attr: str, until: float | None = None) -> float | None:
        """Per-second rate of a count (samples, tokens) over the window.

        Uses the rank's own wall times, so batching and network delay on the
        way to the supervisor do not distort it. The first step counts only
        as the start of the span.

        until is the rank's latest time known (its last heartbeat's wall) while it runs: a step
        open longer than the window's slowest has made nothing for that long, and the span
        reaches on by as much. A rank that stopped stepping (stuck, waiting for one that is,
        out of data under DDP's Join) then reads a falling rate, not its last one for ever,
        while a steady rank, whose open step is never past its slowest, reads exactly what
        its steps say.
        """
        if self._counts[attr] < 2:
            return None
        first, last = self.points[0], self.points[-1]
        if self._counts[attr] != len(self.points) or getattr(first, attr) is None:
            return self._rate_of_some(attr, until)
        span = self._span(first.wall, last.wall) + self._open(until)
        return (self._sums[attr] - getattr(first, attr)) / span if span > 0 else None

    def _open(self, until: float | None) -> float:
        """Seconds the step in progress at until has run past the window's slowest step. It is
        counted from the last step, or from the end of time left out after it (a step held for
        a pause is not added: its end is the gap's)."""
        if until is None or not self.points:
            return 0.0
        since = max(self.points[-1].wall, max((end for _, end in self.gaps), default=0.0))
        return max(0.0, until - since - self._sorted_step_ms[-1] / 1000.0)

    def _span(self, first: float, last: float) -> float:
        """Seconds from first to last, less the time left out between them: a paused step's, an
        evaluation's (which a paused step may hold too: counted once)."""
        left_out, reached = 0.0, first
        for start, end in sorted(self.gaps):
            start, end = max(start, reached), min(end, last)
            if end > start:
                left_out += end - start
                reached = end
        return last - first - left_out

    def _rate_of_some(self, attr: str, until: float | None) -> float | None:
        """The rate when only some steps carry the count: over those alone."""
        points = [p for p in self.points if getattr(p, attr) is not None]
        span = self._span(points[0].wall, points[-1].wall) + self._open(until)
        if span <= 0:
            return None
        counted: float = sum(getattr(p, attr) for p in points[1:])
        return counted / span
