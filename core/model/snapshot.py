"""A job's state as a few frames: how a late dashboard, or a replay of a long run, starts at once.

Folding a run's log record by record costs time in proportion to the run:
1.9 million records, 50 minutes of a 64-rank job, took 16 s. The
supervisor has already folded them; `frames(state)` turns its JobState
into a handful of wire frames (each under the wire's frame limit, so 1,024
ranks split into several), and a JobState that ingests them is the same
state: every rank's figures and recent steps, the job's counts, goodput,
the alerts panel, the charts' history. Then the live records follow.

A replay does the same from `state.snapshot` beside the run's log: the
frames, then the log's records after the point they were taken at
(`Position`). The supervisor writes it when the job ends; a replay of a run
without one (its supervisor was killed) reads the whole log once and
writes it.

Only plain data crosses: a dashboard attached over TCP decodes what the
supervisor sends and never runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from array import array
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast, final

from ddptop.core import wire
from ddptop.core.eventlog import Position, read_after, read_all
from ddptop.core.model import profiles
from ddptop.core.model.goodput import TYPICAL_KEPT, Attempt, Goodput
from ddptop.core.model.history import RANK_SERIES, Filling, History, Point, pack, unpack
from ddptop.core.model.rank import GpuState, RankState, replicas_told
from ddptop.core.model.stats import StepPoint
from ddptop.core.wire import records

if TYPE_CHECKING:
    from ddptop.core.model.job import JobState

SNAPSHOT_TYPES = frozenset({"snapshot", "snapshot_ranks", "snapshot_points", "snapshot_capture"})


@final
class SnapshotJob(TypedDict):
    """The first frame: the job's own fields, its counts, events, GPUs, goodput and marks."""

    type: Literal["snapshot"]
    version: int
    steps_done: int | None
    job: dict[str, Any]
    alert_kinds: dict[str, int]
    events: list[wire.Record]
    gpus: list[list[Any]]
    goodput: dict[str, Any]
    marks: list[list[Any]]
    whole_span: int
    filling: dict[str, Any]


@final
class SnapshotRanks(TypedDict):
    """Some of the ranks, each by field name (_rank)."""

    type: Literal["snapshot_ranks"]
    ranks: list[dict[str, Any]]


@final
class SnapshotCapture(TypedDict):
    """The latest profiler capture, and some of its ranks' profile records."""

    type: Literal["snapshot_capture"]
    capture: dict[str, Any]
    results: list[records.Profile]


@final
class SnapshotPoints(TypedDict):
    """Some of the charts' points, of the recent or the whole timeline."""

    type: Literal["snapshot_points"]
    tier: str
    points: list[list[Any]]


SnapshotFrame = SnapshotJob | SnapshotRanks | SnapshotCapture | SnapshotPoints
"""What a snapshot is made of: plain data a JobState folds as it folds records (restore)."""
VERSION = 4
"""The layout of the frames below. 4: goodput's fold keeps time paused apart from stalled,
and a rank's window the steps it left out as pauses;
3: with the latest profiler capture (2 had none, so a
replay of a run saved so reads its log whole again); 2: ranks and their windows by field
name (1 had windows by position, and no number). A reader reads only its own version: a
replay then reads the log whole, a dashboard says it cannot read the state."""
FRAME_BUDGET = wire.MAX_FRAME // 2
"""Bytes a snapshot frame aims at: half the limit leaves room for a rank's long stack."""
RANK_BYTES = 12_000
"""About what one rank's state encodes to, with a full window of steps."""
CAPTURE_BYTES = 8_000
"""About what one rank's profile record encodes to at most: its phases, its top ops by CPU
and by CUDA with their names, its trace's path."""
_RANK_SKIP = frozenset({"window", "gpu_reading", "gpu"})
_JOB_FIELDS = ("meta", "world_size", "total_steps", "started", "last_wall", "records", "alerts", "exit", "checkpoint_step")


def frames(state: JobState) -> Iterator[SnapshotFrame]:
    """The state as frames: the job first, then its ranks, the latest profiler capture (what
    a rank's detail shows), then the charts' points."""
    history = state.history
    yield {
        "type": "snapshot",
        "version": VERSION,
        "steps_done": state.steps_done(),
        "job": {name: getattr(state, name) for name in _JOB_FIELDS},
        "alert_kinds": dict(state.alert_kinds),
        "events": list(state.events),
        "gpus": [[node, dataclasses.asdict(gpu)] for (node, _), gpu in state.gpus.items()],
        "goodput": _goodput(state.goodput),
        "marks": [[m.wall, m.kind, m.text] for m in history.marks],
        "whole_span": history.whole.span,
        "filling": _filling(history.whole.filling),
    }
    ranks = list(state.ranks.values())
    per_frame = max(1, FRAME_BUDGET // RANK_BYTES)
    for start in range(0, len(ranks), per_frame):
        yield {"type": "snapshot_ranks", "ranks": [_rank(r) for r in ranks[start : start + per_frame]]}
    yield from _capture(state.latest_capture)
    point_bytes = 64 + 4 * len(RANK_SERIES) * (max(state.ranks, default=0) + 1) + 16 * 16
    per_frame = max(1, FRAME_BUDGET // point_bytes)
    for tier, timeline in (("recent", history.recent), ("whole", history.whole)):
        points = list(timeline.points)
        for start in range(0, len(points), per_frame):
            chunk = [[p.wall, p.span, p.job, {k: pack(v) for k, v in p.ranks.items()}] for p in points[start : start + per_frame]]
            yield {"type": "snapshot_points", "tier": tier, "points": chunk}


def save(path: Path, state: JobState, position: Position) -> None:
    """Keep the state beside the run, with the log position it is as of; whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(wire.encode({"type": "position", "segment": position[0], "offset": position[1]}))
            for frame in frames(state):
                out.write(wire.encode(frame))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def load(path: Path) -> tuple[Position, list[SnapshotFrame]] | None:
    """A saved state and its position; None when there is none, or it cannot be read whole."""
    with contextlib.suppress(OSError, wire.FrameError, KeyError, TypeError, IndexError), path.open("rb") as stream:
        found = list(wire.read_frames(stream))
        head = found[0]
        if head["type"] == "position" and all(f.get("type") in SNAPSHOT_TYPES for f in found[1:]) and readable(found[1]):
            return (head["segment"], head["offset"]), cast(list[SnapshotFrame], found[1:])
    return None


def replayed(saved: Path, events: Path) -> tuple[Iterator[wire.Record | SnapshotFrame], bool]:
    """A run's records as a replay folds them: its saved state and the records logged after it,
    or the whole log where there is no saved state that fits it (then True: the state folded
    from it is worth saving, for the next reader)."""
    loaded = load(saved)
    if loaded is not None:
        position, frames = loaded
        after = read_after(events, position)
        if after is not None:
            return itertools.chain(frames, after), False
    return read_all(events), True


def steps_done(path: Path) -> int | None:
    """The steps a run had done as of its saved state, reading only the file's first frames
    (`ddptop ls`, for a run whose supervisor died before it could say)."""
    with contextlib.suppress(OSError, wire.FrameError, StopIteration), path.open("rb") as stream:
        frames = wire.read_frames(stream)
        head, first = next(frames), next(frames)
        if head.get("type") == "position" and readable(first) and isinstance(first.get("steps_done"), int):
            return int(first["steps_done"])
    return None


def readable(first: Mapping[str, object]) -> bool:
    """Whether a snapshot's first frame is of the layout this reader knows."""
    return first.get("type") == "snapshot" and first.get("version") == VERSION


def unreadable_text(first: Mapping[str, object]) -> str:
    return (
        f"the supervisor sent its state in snapshot layout {first.get('version', 1)} and this dashboard reads "
        f"layout {VERSION}: run the same ddptop on both sides to see the job's history; live records follow"
    )


def restore(state: JobState, record: SnapshotFrame) -> None:
    """Fold one snapshot frame into a state; the first ("snapshot") starts it afresh."""
    if record["type"] == "snapshot":
        state.snapshot_unreadable = not readable(record)
        if state.snapshot_unreadable:
            notice: records.Notice = {"type": "notice", "wall": state.last_wall, "text": unreadable_text(record)}
            state.events.append(notice)
            return
        _restore_job(state, record)
    elif state.snapshot_unreadable:
        return
    elif record["type"] == "snapshot_ranks":
        for data in record["ranks"]:
            rank = _restored_rank(data)
            if rank.gpu is not None:
                rank.gpu_reading = state.gpus.get(rank.gpu)
            state.ranks[rank.rank] = rank
    elif record["type"] == "snapshot_capture":
        state.latest_capture = profiles.fold(state.captures, cast(records.Capture, {"type": "capture", **record["capture"]}))
        for result in record["results"]:
            profiles.fold(state.captures, result)
    elif record["type"] == "snapshot_points":
        timeline = state.history.timeline(whole=record["tier"] == "whole")
        for wall, span, job, ranks in record["points"]:
            timeline.points.append(Point(wall, span, job, {k: unpack(v) for k, v in ranks.items()}))


def _restore_job(state: JobState, record: SnapshotJob) -> None:
    for name, value in record["job"].items():
        if name in _JOB_FIELDS:
            setattr(state, name, value)
    state.ranks.clear()
    state.captures, state.latest_capture = {}, None
    state.alert_kinds = Counter(record["alert_kinds"])
    state.events = deque(record["events"], maxlen=state.events.maxlen)
    state.gpus = {(node, gpu["index"]): GpuState(**gpu) for node, gpu in record["gpus"]}
    state.goodput = _restored_goodput(record["goodput"])
    state.history = History()
    for wall, kind, text in record["marks"]:
        state.history.mark(wall, kind, text)
    state.history.whole.span = record["whole_span"]
    state.history.whole.filling = _restored_filling(record["filling"])


def _capture(capture: profiles.Capture | None) -> Iterator[SnapshotCapture]:
    """The capture as it stands, and the ranks' profile records as they came (a rank's op
    names are its own, so 1,024 ranks' split into several frames, each with the capture)."""
    if capture is None:
        return
    head = {"id": capture.id, "state": capture.state, "text": capture.text, "ranks": capture.ranks, "steps": capture.steps}
    results = list(capture.results.values())
    per_frame = max(1, FRAME_BUDGET // CAPTURE_BYTES)
    for start in range(0, max(1, len(results)), per_frame):
        yield {"type": "snapshot_capture", "capture": head, "results": results[start : start + per_frame]}


_RANK_FIELDS = tuple(f.name for f in dataclasses.fields(RankState) if f.name not in _RANK_SKIP)
_POINT_FIELDS = StepPoint.FIELDS


def _rank(rank: RankState) -> dict[str, Any]:
    """A rank by field name, its window as one list per StepPoint field: a reader
    built with fields added or removed still reads it (missing ones are None)."""
    data = {name: getattr(rank, name) for name in _RANK_FIELDS}
    data["gpu"] = list(rank.gpu) if rank.gpu is not None else None
    points = rank.window.points
    data["window"] = {name: [getattr(p, name) for p in points] for name in _POINT_FIELDS}
    data["gaps"] = [list(gap) for gap in rank.window.gaps]
    return data


def _restored_rank(data: dict[str, Any]) -> RankState:
    rank = RankState(**{name: data[name] for name in _RANK_FIELDS if name in data})
    rank.gpu = (data["gpu"][0], data["gpu"][1]) if data.get("gpu") else None
    rank.replicas = replicas_told(data.get("replicas"))  # a key of lags(): a tuple, not the wire's list
    window: dict[str, list[Any]] = data["window"]
    length = max((len(values) for values in window.values()), default=0)
    columns = [window.get(name) or [None] * length for name in _POINT_FIELDS]
    for wall, step_ms, *values in zip(*columns):
        rank.window.add(StepPoint(wall, step_ms, **dict(zip(_POINT_FIELDS[2:], values))))
    rank.window.gaps.extend((start, end) for start, end in data.get("gaps", []))
    return rank


def _goodput(goodput: Goodput) -> dict[str, Any]:
    data = {f.name: getattr(goodput, f.name) for f in dataclasses.fields(goodput)}
    data["attempts"] = [[n, dataclasses.astuple(a)] for n, a in goodput.attempts.items()]
    data["typical"] = list(goodput.typical)
    return data


def _restored_goodput(data: dict[str, Any]) -> Goodput:
    fields = dict(data)
    fields["attempts"] = {n: Attempt(*a) for n, a in data["attempts"]}
    fields["typical"] = deque(data["typical"], maxlen=TYPICAL_KEPT)
    return Goodput(**fields)


def _filling(filling: Filling) -> dict[str, Any]:
    return {
        "wall": filling.wall,
        "span": filling.span,
        "job": filling.job,
        "ranks": {series: [sums.tobytes(), counts.tobytes()] for series, (sums, counts) in filling.ranks.items()},
    }


def _restored_filling(data: dict[str, Any]) -> Filling:
    filling = Filling()
    filling.wall, filling.span, filling.job = data["wall"], data["span"], data["job"]
    for series, (sums, counts) in data["ranks"].items():
        filling.ranks[series] = (array("d", sums), array("i", counts))
    return filling
