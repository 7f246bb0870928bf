"""The charts' history, and the job's state as snapshot frames: what a late dashboard and a replay start from."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from builders import hello

from ddptop.core import rundir, wire
from ddptop.core.eventlog import EventLog
from ddptop.core.model import snapshot
from ddptop.core.model.history import RECENT_POINTS, WHOLE_POINTS, History, pack, unpack
from ddptop.core.model.job import JobState
from ddptop.ls import row
from ddptop.supervisor.serving import hub as hubs
from ddptop.tui.source import ReplaySource

BASE = 1_800_000_000.0


def summary(second: int, throughput: float, steps: list[float]) -> dict:
    return {"type": "summary", "wall": BASE + second, "metrics": {"samples_per_s": throughput}, "rank_step_ms": pack(steps)}


def test_a_long_run_of_summaries_fits_the_whole_run_timeline_with_its_means_kept():
    history = History()
    day = 6 * 3600  # the whole run's buckets merge six times (a day's, eight)
    for second in range(day):
        # rank 1 is twice as slow in the second half of the run
        history.add_summary(summary(second, 100.0 if second < day // 2 else 300.0, [10.0, 10.0 if second < day // 2 else 20.0]))
    whole = list(history.whole)
    assert len(whole) <= WHOLE_POINTS + 1 and len(history.recent) == RECENT_POINTS
    assert whole[0].wall == BASE and sum(p.span for p in whole) == day
    mean = sum(p.job["samples_per_s"] * p.span for p in whole) / day
    assert math.isclose(mean, 200.0)
    assert whole[0].rank_value("step_ms", 1) == 10.0 and whole[-1].rank_value("step_ms", 1) == 20.0


def test_a_rank_with_no_step_in_a_second_is_nan_and_left_out_of_the_means():
    history = History()
    history.add_summary(summary(0, 1.0, [10.0, math.nan]))
    history.add_summary(summary(1, 1.0, [30.0, 8.0]))
    assert math.isnan(next(iter(history.recent)).rank_value("step_ms", 1))
    merged = History()
    merged.whole.span = 2  # both seconds in one bucket
    for second, steps in ((0, [10.0, math.nan]), (1, [30.0, 8.0])):
        merged.add_summary(summary(second, 1.0, steps))
    [bucket] = list(merged.whole)
    assert bucket.rank_value("step_ms", 0) == 20.0 and bucket.rank_value("step_ms", 1) == 8.0
    assert list(unpack(pack([1.5, 2.5]))) == [1.5, 2.5]


def busy_state(ranks: int, steps: int) -> JobState:
    """A job with every kind of record the dashboard shows: hellos, steps, samples, alerts, a restart."""
    state = JobState()
    busy(state, state.ingest, ranks, steps)
    return state


def busy(state: JobState, ingest: Callable[[dict], None], ranks: int, steps: int) -> None:
    """Those records, each given to ingest (a state's, or a hub's record) with state folding them."""
    ingest({"type": "run", "wall": BASE, "id": "r", "script": "train.py"})
    for rank in range(ranks):
        ingest(hello(rank, ranks, local_rank=rank % 8, node=rank // 8, pid=10 + rank))
    for step in range(steps):
        wall = BASE + step * 0.1
        for rank in range(ranks):
            record = {
                "type": "step",
                "rank": rank,
                "step": step,
                "wall": wall,
                "step_ms": 100.0 + rank,
                "data_ms": 1.0 + rank,
                "samples": 8,
                "loss": 1.0 / (step + 1),
            }
            if step % 10 == 0:  # DDP's sampled iterations
                record.update(comm_ms=20.0, compute_ms=60.0 + rank, comm_step=step)
            ingest(record)
        if step % 10 == 9:
            ingest(
                {
                    "type": "sample",
                    "wall": wall,
                    "node": 0,
                    "gpus": [{"index": 0, "mem_total": 80 << 30, "util": 50.0}],
                    "procs": [{"rank": 0, "pid": 10, "gpu": 0, "rss": 1 << 30}],
                }
            )
            ingest(state.summary(wall))
    ingest({"type": "alert", "wall": BASE + 5, "kind": "straggler", "text": "rank 3 is slow", "ranks": [3], "action": "none"})
    ingest({"type": "group_restart", "wall": BASE + 6, "node": 0, "restart": 1, "remaining": 2})
    ingest({"type": "checkpoint", "rank": 0, "step": 40, "wall": BASE + 6, "write_ms": 12.0, "path": "ckpt.pt"})
    captured(ingest, list(range(0, ranks, 3)))


OP_NAMES = ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "aten::mkldnn_rnn_layer_backward", "aten::addmm")


def captured(ingest: Callable[[dict], None], ranks: list[int]) -> None:
    """A profiler capture of these ranks, done, each with a profile record as long as a real
    one can be: 15 top ops by CPU and 15 more by CUDA, with long names."""
    ingest({"type": "capture", "wall": BASE + 5.5, "id": "c1", "state": "started", "text": "capturing", "ranks": ranks, "steps": 5})
    for rank in ranks:
        ops = [[f"{OP_NAMES[i % 3]}_{rank}_{i}", 1.5 * i, 0.5 * i, 10.0] for i in range(30)]
        phases = {"data": 1.0 + rank, "forward": 2.0, "backward": 3.0, "comm": 4.0, "overlap": 1.0, "optimizer": 0.5, "step": 11.0 + rank}
        path = f"/scratch/runs/a-long-run-name/profiles/attempt0-rank{rank}-step1000.pt.trace.json.gz"
        ingest({"type": "profile", "rank": rank, "wall": BASE + 5.6, "id": "c1", "first_step": 1000, "steps": 5, "phases": phases,
                "ops": ops, "cuda": True, "path": path})  # fmt: skip
    ingest({"type": "capture", "wall": BASE + 5.7, "id": "c1", "state": "done", "text": "profile c1 done", "ranks": ranks, "steps": 5})


def restored(frames: list[wire.Frame]) -> JobState:
    """Through the wire's own encoding and decoding, as a dashboard receives them."""
    decoder = wire.FrameDecoder()
    state = JobState()
    for frame in decoder.feed(b"".join(wire.encode(f) for f in frames)):
        state.ingest(frame)
    return state


def test_a_state_rebuilt_from_its_snapshot_frames_is_the_same_state():
    state = busy_state(ranks=12, steps=120)
    copy = restored(list(snapshot.frames(state)))
    assert copy.totals() == state.totals()
    assert copy.records == state.records and copy.alert_kinds == state.alert_kinds and list(copy.events) == list(state.events)
    assert copy.goodput.split(BASE + 20) == state.goodput.split(BASE + 20)
    for rank, ours in state.ranks.items():
        theirs = copy.ranks[rank]
        assert (theirs.step, theirs.latest, theirs.compute_ms(), theirs.gpu, theirs.rss) == (
            ours.step,
            ours.latest,
            ours.compute_ms(),
            ours.gpu,
            ours.rss,
        )
    assert copy.ranks[0].gpu_reading is copy.gpus[(0, 0)]  # the rank's GPU is the job's, as after a sample
    for ours_tl, theirs_tl in ((state.history.recent, copy.history.recent), (state.history.whole, copy.history.whole)):
        assert [(p.wall, p.span, p.job, list(p.ranks["step_ms"])) for p in ours_tl] == [
            (p.wall, p.span, p.job, list(p.ranks["step_ms"])) for p in theirs_tl
        ]
    assert [m.kind for m in copy.history.marks] == ["compute", "alert", "restart"]
    ours_capture, their_capture = state.latest_capture, copy.latest_capture  # what a rank's detail shows
    assert ours_capture is not None and their_capture is not None and their_capture.results == ours_capture.results
    assert (their_capture.id, their_capture.state, their_capture.ranks, sorted(their_capture.results)) == (
        "c1",
        "done",
        [0, 3, 6, 9],
        [0, 3, 6, 9],
    )
    # And it goes on as the original does.
    for s in (state, copy):
        s.ingest({"type": "step", "rank": 0, "step": 120, "wall": BASE + 13, "step_ms": 100.0, "samples": 8})
    assert copy.totals() == state.totals()


def test_snapshot_frames_stay_under_the_frame_limit_at_1024_ranks():
    state = busy_state(ranks=1024, steps=10)
    frames = list(snapshot.frames(state))
    sizes = [len(wire.encode(f)) for f in frames]  # encode raises past the limit
    assert max(sizes) < wire.MAX_FRAME and len(restored(frames).ranks) == 1024
    capture = restored(frames).latest_capture  # every rank's profile record, over several frames
    assert capture is not None and len(capture.results) == 342 and len([f for f in frames if f["type"] == "snapshot_capture"]) > 1
    [one] = [f for f in snapshot.frames(busy_state(ranks=1, steps=1)) if f["type"] == "snapshot_capture"]
    assert len(wire.encode(one)) < snapshot.CAPTURE_BYTES + 200  # a rank's record, with the capture it belongs to
    full = busy_state(ranks=1, steps=200)  # a full window of steps: what a rank is budgeted at
    [ranks] = [f for f in snapshot.frames(full) if f["type"] == "snapshot_ranks"]
    assert len(wire.encode(ranks)) < snapshot.RANK_BYTES


def write_run(path: Path, state: JobState, records: list[dict]) -> rundir.RunDir:
    run = rundir.create(Path("train.py"), path)
    log = EventLog(run.events_path)
    for record in records:
        log.append(record)
        state.ingest(record)
    log.close()
    return run


async def read(source: ReplaySource) -> JobState:
    state = JobState()
    async for record in source.records():
        state.ingest(record)
    source.finished(state)
    return state


async def test_replay_starts_from_the_saved_state_and_reads_only_what_came_after(tmp_path):
    state = JobState()
    steps = [{"type": "step", "rank": 0, "step": n, "wall": BASE + n, "step_ms": 5.0} for n in range(50)]
    run = write_run(tmp_path / "run", state, [{"type": "run", "wall": BASE, "id": "r", "script": "t.py"}, *steps])
    first = ReplaySource(run)
    assert (await read(first)).ranks[0].step == 49 and first.read_whole  # no saved state: read whole, then kept
    assert run.snapshot_path.exists()
    log = EventLog(run.events_path)  # the log goes on after the state was saved
    log.append({"type": "step", "rank": 0, "step": 50, "wall": BASE + 50, "step_ms": 5.0})
    log.close()
    second = ReplaySource(run)
    replayed = await read(second)
    assert not second.read_whole and replayed.ranks[0].step == 50 and replayed.records == 52


async def test_a_saved_state_that_does_not_fit_the_log_is_ignored(tmp_path):
    state = JobState()
    run = write_run(tmp_path / "run", state, [{"type": "run", "wall": BASE, "id": "r", "script": "t.py"}])
    snapshot.save(run.snapshot_path, busy_state(4, 20), (1, 10**9))  # a position past the log's end
    source = ReplaySource(run)
    assert (await read(source)).ranks == {} and source.read_whole
    run.snapshot_path.write_bytes(b"not frames")
    source = ReplaySource(run)
    assert (await read(source)).records == 1 and source.read_whole


async def test_a_run_whose_supervisor_died_replays_from_its_last_periodic_snapshot(tmp_path):
    run = rundir.create(Path("train.py"), tmp_path / "run")
    run.write_meta({"script": "train.py", "state": "running", "started": BASE})  # as a supervisor starts it
    now = [0.0]
    hub = hubs.Hub(run, lambda command: None, clock=lambda: now[0])
    busy(hub.state, hub.record, ranks=8, steps=60)
    hub.keep_state()
    assert not run.snapshot_path.exists(), "not before SNAPSHOT_EVERY_S has passed"
    now[0] = hubs.SNAPSHOT_EVERY_S
    hub.keep_state()
    assert hub.snapshot_s is not None and run.snapshot_path.exists()
    for rank in range(8):  # after the snapshot, then the supervisor is killed: its log flushed, nothing else
        hub.record({"type": "step", "rank": rank, "step": 60, "wall": BASE + 7, "step_ms": 100.0, "samples": 8})
    hub.flush()
    source = ReplaySource(run)
    replayed = await read(source)
    assert not source.read_whole, "it starts from the snapshot, not the log's start"
    assert replayed.totals() == hub.state.totals() and replayed.records == hub.state.records
    listed = row(run, BASE)
    assert listed["state"] == "failed" and listed["steps"] == replayed.totals().steps_done == 61, "ls agrees with the replay"
    assert listed["duration_s"] == round(replayed.last_wall - BASE, 1) == 7.0


async def test_a_snapshot_of_another_layout_is_not_read_as_this_one(tmp_path):
    state = JobState()
    run = write_run(tmp_path / "run", state, [{"type": "run", "wall": BASE, "id": "r", "script": "t.py"}])
    snapshot.save(run.snapshot_path, busy_state(4, 20), (1, 0))
    assert snapshot.load(run.snapshot_path) is not None
    frames = list(snapshot.frames(busy_state(4, 20)))
    older = [{**frames[0], "version": 1}, *frames[1:]]
    with run.snapshot_path.open("wb") as out:
        for frame in [{"type": "position", "segment": 1, "offset": 0}, *older]:
            out.write(wire.encode(frame))
    assert snapshot.load(run.snapshot_path) is None
    source = ReplaySource(run)
    assert (await read(source)).ranks == {} and source.read_whole, "the log is read whole instead"
    dashboard = restored(older)
    assert dashboard.ranks == {} and "snapshot layout 1" in dashboard.events[-1]["text"]


@pytest.mark.parametrize("missing", ["tokens", "comm_bytes"])
def test_a_snapshot_from_a_reader_without_a_window_field_still_reads(missing):
    frames = list(snapshot.frames(busy_state(2, 20)))
    for frame in frames:
        for rank in frame.get("ranks", []):
            del rank["window"][missing]
    copy = restored(frames)
    assert copy.lags() == busy_state(2, 20).lags()
    assert {getattr(p, missing) for p in copy.ranks[1].window.points} == {None}


def test_the_ranks_chart_draws_own_work_as_the_straggler_rule_reads_it_not_step_less_sampled_comm():
    """comm_ms comes on DDP's sampled steps only: a second's mean step less its sampled comm is no
    rank's own work (it went negative on a real run); the summary carries the lags' own work."""
    from ddptop.tui.widgets.rank_heatmap import own_matrix

    state = busy_state(ranks=2, steps=120)
    history = History()
    history.add_summary(state.summary(BASE + 30))
    [point] = history.recent.points
    lags = state.lags()
    assert own_matrix([point], 2).tolist() == [[pytest.approx(lags[0].own_ms), pytest.approx(lags[1].own_ms)]]
    assert [lags[0].own_ms, lags[1].own_ms] == [1.0 + 60.0, 2.0 + 61.0]  # data wait and compute, rank by rank


def test_the_ranks_chart_says_own_work_is_the_data_wait_alone_until_every_rank_has_three_compute_samples():
    from ddptop.core.model.lag import DATA_ALONE, counts_compute
    from ddptop.tui.widgets.charts import rank_drawing
    from ddptop.tui.widgets.time_axis import window

    early, later = busy_state(ranks=2, steps=20), busy_state(ranks=2, steps=120)  # 1 and 11 samples past warm-up
    assert not counts_compute(early.ranks.values()) and counts_compute(later.ranks.values())
    assert early.lags()[1].own_ms == 2.0 and later.lags()[1].own_ms == 2.0 + 61.0
    drawn = rank_drawing(window(early.history, False, early.started, BASE + 20), 2, data_alone=True)
    assert DATA_ALONE in drawn.notes


def test_the_ranks_chart_marks_where_own_work_starts_to_count_compute():
    """Own work jumps from the data wait to data wait and compute once DDP has timed every rank's
    compute: 10 ms to 290 ms on a real run, which read as a 30x slowdown. The summary says when
    it counts compute, a dashboard folding it marks the time once, and the ranks' chart (alone)
    draws that mark."""
    from ddptop.tui.widgets.charts import Charts, job_drawing, rank_drawing
    from ddptop.tui.widgets.time_axis import window

    early, later = busy_state(ranks=2, steps=20), busy_state(ranks=2, steps=120)
    assert early.summary(BASE + 20)["own_counts_compute"] is False
    assert later.summary(BASE + 30)["own_counts_compute"] is True
    dashboard = JobState()
    for wall, state in ((BASE + 20, early), (BASE + 21, early), (BASE + 30, later), (BASE + 31, later)):
        dashboard.ingest(state.summary(wall))
    assert [(m.wall, m.kind) for m in dashboard.history.marks] == [(BASE + 30, "compute")]
    win = window(dashboard.history, True, BASE, BASE + 31)
    assert "compute" in rank_drawing(win, 2).marks
    title, metrics = Charts.GROUPS[0]
    assert "compute" not in job_drawing(title, metrics, win).marks


def test_a_pipeline_s_later_stage_is_drawn_against_its_own_ranks_not_as_the_slowest():
    """Three stages over six ranks ({0,3}, {1,4}, {2,5}), the last waiting 25x as long for its
    activations, which reads as its data wait: the ranks chart and the heatmap set each rank
    against its own stage's, as the straggler rule does (lags), and rank 5, slower than its
    stage's rank 2 by half, is the slowest, at the rule's ratio."""
    import numpy as np

    from ddptop.core.model.lag import peer_groups
    from ddptop.tui.widgets.charts import rank_drawing
    from ddptop.tui.widgets.rank_heatmap import heat
    from ddptop.tui.widgets.time_axis import window

    state = JobState()
    for rank in range(6):
        state.ingest(hello(rank, 6))
    for step in range(50):
        for rank in range(6):
            data = {2: 10.0, 5: 15.0}.get(rank, 0.4)
            state.ingest({"type": "step", "rank": rank, "step": step, "wall": BASE + step * 0.1, "step_ms": 20.0, "data_ms": data})
    history = History()
    history.add_summary(state.summary(BASE + 5))
    win = window(history, False, BASE, BASE + 5)
    assert "slowest now: rank 5 at 37.50x" in rank_drawing(win, 6).notes
    assert heat(win.points, 6, 6, 4).worst == (5, pytest.approx(37.5))
    for rank in range(6):
        replicas = [rank % 3, rank % 3 + 3]
        state.ingest({"type": "heartbeat", "rank": rank, "wall": BASE + 5, "phase": "data", "step": 50, "dropped": 0, "replicas": replicas})
    groups = peer_groups(state.ranks.values())
    assert sorted(groups) == [[0, 3], [1, 4], [2, 5]]
    assert state.lags()[5].ratio == pytest.approx(1.5)
    assert "slowest now: rank 5 at 1.50x" in rank_drawing(win, 6, groups=groups).notes
    mapped = heat(win.points, 6, 6, 4, groups)
    assert np.nanmax(mapped.rows) == pytest.approx(1.5) and mapped.worst == (5, pytest.approx(1.5))


def test_the_ranks_chart_names_a_straggler_among_two_at_the_rule_s_ratio():
    """Of two ranks the median is the faster, as the straggler rule takes it: rank 1 at 5x is
    5x on the chart, not 1x against itself (the upper middle) or 1.67x against their mean."""
    from ddptop.tui.widgets.charts import rank_drawing
    from ddptop.tui.widgets.rank_heatmap import heat
    from ddptop.tui.widgets.time_axis import window

    state = JobState()
    for rank in range(2):
        state.ingest(hello(rank, 2))
    for step in range(50):
        for rank in range(2):
            state.ingest(
                {"type": "step", "rank": rank, "step": step, "wall": BASE + step * 0.1, "step_ms": 60.0, "data_ms": 10.0 + 40.0 * rank}
            )
    history = History()
    history.add_summary(state.summary(BASE + 5))
    win = window(history, False, BASE, BASE + 5)
    assert state.lags()[1].ratio == pytest.approx(5.0)
    assert "slowest now: rank 1 at 5.00x" in rank_drawing(win, 2).notes
    assert heat(win.points, 2, 2, 4).worst == (1, pytest.approx(5.0))
