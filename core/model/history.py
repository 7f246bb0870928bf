"""What the dashboard's charts draw: the job's figures and each rank's step times over the run.

Fed by the supervisor's once-a-second summary records (and the alerts and
restarts to mark on the time axis), a History keeps two timelines: the last
ten minutes at one point a second, and the whole run in at most
WHOLE_POINTS buckets whose span doubles, neighbours merged, each time the
run outgrows them. So a day-long run costs what an hour-long one does, and
a dashboard that attaches late is sent this, not the run's log.

Per-rank values travel as float32 arrays indexed by rank (NaN: the rank
finished no step in that second), so a point costs a few bytes a rank at
1,024 ranks, and a bucket is three small objects whatever the world size.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ddptop.core.wire import records

NAN = float("nan")
RECENT_POINTS = 600
"""The recent timeline: ten minutes of per-second summaries."""
WHOLE_POINTS = 512
"""The whole run's timeline never holds more buckets than this: enough for a wide terminal's chart."""
MARKS = 1000
"""Alerts and restarts kept for the time axis; older ones fall off, the charts' left edge first."""
RANK_SERIES = ("step_ms", "own_ms", "comm_ms")
"""Per-rank series a summary carries: step time, and own work (model/lag.py: data wait and
compute), what the ranks' chart draws. A run logged before own_ms was carried has comm_ms
instead, its comm time every step: its own work is its step less that."""


def pack(values: Iterable[float]) -> bytes:
    """Per-rank values as the summary record carries them: float32, little-endian."""
    packed = array("f", values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack(data: bytes) -> array[float]:
    values = array("f")
    values.frombytes(data[: len(data) - len(data) % 4])
    if sys.byteorder == "big":
        values.byteswap()
    return values


@dataclass(slots=True)
class Point:
    """One bucket of a timeline: its first second, how many seconds it spans, the job's
    figures (means over the span) and each rank's (by rank index, NaN where none)."""

    wall: float
    span: int
    job: dict[str, float]
    ranks: dict[str, array[float]]

    def rank_value(self, series: str, rank: int) -> float:
        values = self.ranks.get(series)
        return values[rank] if values is not None and rank < len(values) else NAN


class Filling:
    """A bucket being filled: running sums, so a point costs O(ranks) to add and the bucket
    O(ranks) to read, however many seconds it spans. Every figure is the mean of the points'
    that are numbers (NaN where none is); points of equal span weigh alike, so neighbouring
    buckets merge the same way."""

    def __init__(self) -> None:
        self.wall = NAN
        self.span = 0
        self.job: dict[str, list[float]] = {}
        self.ranks: dict[str, tuple[array[float], array[int]]] = {}

    def add(self, point: Point) -> None:
        if not self.span:
            self.wall = point.wall
        self.span += point.span
        for key, value in point.job.items():
            if not math.isnan(value):
                total = self.job.setdefault(key, [0.0, 0])
                total[0] += value
                total[1] += 1
        for series, values in point.ranks.items():
            sums, counts = self.ranks.setdefault(series, (array("d"), array("i")))
            if len(sums) < len(values):
                sums.extend([0.0] * (len(values) - len(sums)))
                counts.extend([0] * (len(values) - len(counts)))
            for rank, value in enumerate(values):
                if not math.isnan(value):
                    sums[rank] += value
                    counts[rank] += 1

    def point(self) -> Point:
        job = {key: total / n for key, (total, n) in self.job.items()}
        ranks = {
            series: array("f", (total / n if n else NAN for total, n in zip(sums, counts))) for series, (sums, counts) in self.ranks.items()
        }
        return Point(self.wall, self.span, job, ranks)


def _merged(points: list[Point]) -> Point:
    bucket = Filling()
    for point in points:
        bucket.add(point)
    return bucket.point()


class Timeline:
    """Points oldest first. grows=False keeps the last `limit` as they came; grows=True keeps
    them all, merging neighbours in pairs whenever there are more than `limit`."""

    def __init__(self, limit: int, grows: bool) -> None:
        self.limit = limit
        self.grows = grows
        self.points: deque[Point] = deque(maxlen=None if grows else limit)
        self.span = 1
        """Seconds per closed bucket (grows=True): doubles at each merge."""
        self.filling = Filling()

    def add(self, point: Point) -> None:
        if not self.grows:
            self.points.append(point)
            return
        self.filling.add(point)
        if self.filling.span >= self.span:
            self.points.append(self.filling.point())
            self.filling = Filling()
        if len(self.points) > self.limit:
            pairs = list(self.points)
            self.points = deque(_merged(pairs[i : i + 2]) for i in range(0, len(pairs), 2))
            self.span *= 2

    def __iter__(self) -> Iterator[Point]:
        """Closed buckets, then the one still filling, so the newest second always shows."""
        yield from self.points
        if self.filling.span:
            yield self.filling.point()

    def __len__(self) -> int:
        return len(self.points) + (1 if self.filling.span else 0)


@dataclass(frozen=True, slots=True)
class Mark:
    """Something to mark on the time axis: an alert, a restart, a change in what a chart counts."""

    wall: float
    kind: str
    """"alert", "restart", or "compute": where the ranks' own work starts to count their compute."""
    text: str


class History:
    def __init__(self) -> None:
        self.recent = Timeline(RECENT_POINTS, grows=False)
        self.whole = Timeline(WHOLE_POINTS, grows=True)
        self.marks: deque[Mark] = deque(maxlen=MARKS)

    def add_summary(self, record: records.Summary) -> None:
        job = {key: float(value) for key, value in record.get("metrics", {}).items() if value is not None}
        ranks = {series: unpack(data) for series in RANK_SERIES if isinstance(data := record.get(f"rank_{series}"), bytes)}
        point = Point(record["wall"], 1, job, ranks)
        self.recent.add(point)
        self.whole.add(point)

    def mark(self, wall: float, kind: str, text: str) -> None:
        self.marks.append(Mark(wall, kind, text))

    def timeline(self, whole: bool) -> Timeline:
        return self.whole if whole else self.recent
