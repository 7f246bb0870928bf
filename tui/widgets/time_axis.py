"""What every chart shares: the time window, its axis ticks, and points thinned to the screen.

The x axis is the run's elapsed time (what `ddptop ls` and the header say),
so a restart or an alert marked on it reads the same in every chart.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ddptop.core.format import duration
from ddptop.core.model.history import History, Mark, Point

RECENT_S = 600.0
"""The "last minutes" window: the recent timeline's ten minutes."""


@dataclass(frozen=True)
class Window:
    """What the charts show: the run's points between two walls, and the run's start."""

    points: list[Point]
    marks: list[Mark]
    started: float
    first: float
    last: float
    whole: bool

    def x(self, wall: float) -> float:
        return wall - self.started

    @property
    def name(self) -> str:
        return "whole run" if self.whole else "last 10 min"


def window(history: History, whole: bool, started: float, now: float) -> Window:
    """The whole run's buckets, or the last ten minutes' seconds ending now."""
    points = list(history.timeline(whole))
    first = points[0].wall if points else now
    if not whole:
        first = max(first, now - RECENT_S)
        points = [p for p in points if p.wall >= first]
    marks = [m for m in history.marks if first <= m.wall <= now]
    return Window(points, marks, started, first, max(now, first + 1.0), whole)


def thin(xs: Sequence[float], ys: Sequence[float], most: int) -> tuple[list[float], list[float]]:
    """At most `most` points, neighbours averaged: a chart cannot show more than two a column,
    and drawing more costs time for nothing."""
    pairs = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
    if len(pairs) <= most:
        return [x for x, _ in pairs], [y for _, y in pairs]
    size = len(pairs) / most
    out_x, out_y = [], []
    for i in range(most):
        group = pairs[int(i * size) : int((i + 1) * size)] or pairs[-1:]
        out_x.append(group[-1][0])
        out_y.append(sum(y for _, y in group) / len(group))
    return out_x, out_y


GAP_FACTOR = 4.0
"""Points further apart than this many times the usual spacing are a gap (a restart, a hang):
the line stops there rather than drawing a slope across what was not measured."""


def gaps_apart(xs: list[float], ys: list[float]) -> list[tuple[list[float], list[float]]]:
    """The line in parts, split at its gaps; no parts for no points (plotext fails on an empty
    series, and a legend entry needs one)."""
    if not xs:
        return []
    steps = sorted(b - a for a, b in itertools.pairwise(xs))
    usual = steps[len(steps) // 2] if steps else 0.0
    parts, start = [], 0
    for i in range(1, len(xs)):
        if usual and xs[i] - xs[i - 1] > GAP_FACTOR * usual:
            parts.append((xs[start:i], ys[start:i]))
            start = i
    parts.append((xs[start:], ys[start:]))
    return parts


def time_ticks(first: float, last: float, count: int) -> tuple[list[float], list[str]]:
    """Evenly spaced ticks on the elapsed-time axis, labelled h:mm:ss (or m:ss)."""
    count = max(2, count)
    step = (last - first) / (count - 1)
    ticks = [first + i * step for i in range(count)]
    return ticks, [duration(max(0.0, t)) for t in ticks]


WIDENINGS = 8
"""Times a y range is doubled at most to make its labels distinct (256 times its span)."""


def value_axis(
    low: float, high: float, log: bool, text: Callable[[float, float], str], count: int = 3
) -> tuple[float, float, list[float], list[str]]:
    """The y axis for values from low to high: its ends, and its ticks labelled in the metric's
    own units (bytes as GiB, ms as ms); on a log axis at the powers of ten the range spans, and
    its ends. `text` is told each tick and the magnitude whose unit it is read in: a linear
    axis's largest, so its labels share one unit; on a log axis each tick's own.

    A flat series is drawn as a line mid-chart. A linear range narrower than its labels can tell
    apart (memory from 1.00 to 1.06 GiB, each tick "1.0 GiB") is widened about its middle until
    they do: otherwise a change of a few percent fills the chart's height with one label to read
    it by, and looks like a leak."""
    if log:
        decades = [10.0**e for e in range(math.ceil(math.log10(low)), math.floor(math.log10(high)) + 1)]
        ticks = sorted({low, *decades, high})
        return low, high, ticks, [text(t, t) for t in ticks]
    if high - low <= 0.01 * max(abs(low), abs(high)):
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    positive = low >= 0
    for _ in range(WIDENINGS):
        ticks = [low + i * (high - low) / (count - 1) for i in range(count)]
        top = max(abs(low), abs(high))
        labels = [text(t, top) for t in ticks]
        if len(set(labels)) == count:
            break
        half = high - low
        low, high = (low + high) / 2 - half, (low + high) / 2 + half
        if positive and low < 0:  # bytes, counts and times read no lower than 0
            low, high = 0.0, high - low
    kept = [i for i, label in enumerate(labels) if label not in labels[:i]]  # still too coarse after all widenings: each once
    return low, high, [ticks[i] for i in kept], [labels[i] for i in kept]


def spans_decades(values: Sequence[float]) -> bool:
    """A series is drawn on a log scale when it is all positive and spans more than a decade."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 10
