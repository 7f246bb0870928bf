"""Rolling statistics over a rank's recent steps.

Windows are bounded (a deque per rank), so memory stays flat however long
the job runs; percentiles are taken over the window by nearest rank, which
needs no interpolation and is exact for the values that were seen.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW = 100
"""Steps per rank that the rolling figures cover."""


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of values; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    index = max(0, math.ceil(q / 100.0 * len(ordered)) - 1)
    return ordered[min(index, len(ordered) - 1)]


def median(values: list[float]) -> float | None:
    return percentile(values, 50)


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float | None:
    """All-reduce bus bandwidth as nccl-tests defines it: algbw * 2(n-1)/n."""
    if seconds <= 0 or world_size < 1:
        return None
    return nbytes / seconds * 2 * (world_size - 1) / world_size


@dataclass
class StepPoint:
    wall: float
    step_ms: float
    data_ms: float | None
    comm_ms: float | None
    comm_bytes: int | None
    samples: int | None
    tokens: int | None


class RollingWindow:
    def __init__(self, size: int = WINDOW) -> None:
        self.points: deque[StepPoint] = deque(maxlen=size)

    def add(self, point: StepPoint) -> None:
        self.points.append(point)

    def _values(self, attr: str) -> list[float]:
        return [v for p in self.points if (v := getattr(p, attr)) is not None]

    def step_ms(self, q: float) -> float | None:
        return percentile(self._values("step_ms"), q)

    def mean(self, attr: str) -> float | None:
        values = self._values(attr)
        return sum(values) / len(values) if values else None

    def rate(self, attr: str) -> float | None:
        """Per-second rate of a count (samples, tokens) over the window.

        Uses the rank's own wall times, so batching and network delay on the
        way to the supervisor do not distort it.
        """
        points = [p for p in self.points if getattr(p, attr) is not None]
        if len(points) < 2:
            return None
        span = points[-1].wall - points[0].wall
        if span <= 0:
            return None
        return sum(getattr(p, attr) for p in points[1:]) / span
