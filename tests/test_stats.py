import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddptop.core.model.stats import RollingWindow, StepPoint, bus_bandwidth, percentile
from ddptop.trainer.commtimer import union_ms


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile(values, 100) == 100
    assert percentile([], 50) is None


def test_union_of_overlapping_intervals():
    assert union_ms([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_ms([]) == 0


@given(st.lists(st.tuples(st.floats(0, 1e3), st.floats(0, 1e3)).map(lambda t: (min(t), max(t))), max_size=20))
def test_union_is_at_most_the_sum_and_at_least_the_longest(intervals):
    total = union_ms(intervals)
    assert total <= sum(e - s for s, e in intervals) + 1e-6
    assert total >= max((e - s for s, e in intervals), default=0) - 1e-6


def test_a_steps_comm_is_its_buckets_union_and_their_sizes_however_many_threads_end_them():
    """The hook begins a span on the training thread; gloo's threads end them, in any
    order, each journaling its span; the step's record has their union and sizes."""
    import threading

    import torch

    from ddptop.trainer.commtimer import clock
    from ddptop.trainer.steps import COMM, StepTracker

    records: list = []
    tracker = StepTracker(0, emit=records.append)
    tracker.forward_begin(4)
    buffers = [torch.zeros(n) for n in (10, 20, 30)]
    spans = [clock() for _ in buffers]
    enders = [
        threading.Thread(target=lambda start=start, buffer=buffer: tracker.journal.append((COMM, start, clock(), buffer)))
        for start, buffer in zip(spans, buffers)
    ]
    for ender in reversed(enders):
        ender.start()
        ender.join()
    tracker.optimizer_end({})
    tracker.forward_begin(4)
    tracker.optimizer_end({})
    tracker.flush()
    first, second = records
    assert first["comm_bytes"] == 60 * 4 and 0.0 <= first["comm_ms"] < 1000.0
    assert "comm_ms" not in second, "the next step starts empty"


def test_bus_bandwidth_follows_nccl_tests():
    assert bus_bandwidth(1e9, 1.0, 4) == pytest.approx(1.5e9)
    assert bus_bandwidth(1e9, 1.0, 1) == 0


def test_window_is_bounded_and_rates_use_rank_wall_time():
    window = RollingWindow(size=10)
    for i in range(50):
        window.add(StepPoint(wall=i * 0.1, step_ms=100.0, data_ms=None, comm_ms=None, comm_bytes=None, samples=32, tokens=None))
    assert len(window.points) == 10
    assert window.rate("samples") == pytest.approx(320.0)
    assert window.step_ms(50) == 100.0


@given(
    st.lists(st.tuples(st.floats(0.1, 1e4), st.none() | st.floats(0, 1e3), st.integers(1, 64)), min_size=1, max_size=300),
    st.integers(1, 50),
)
def test_incremental_window_matches_a_recomputation(steps, size):
    window = RollingWindow(size=size)
    for i, (step_ms, comm_ms, samples) in enumerate(steps):
        window.add(StepPoint(wall=i * 0.1, step_ms=step_ms, data_ms=None, comm_ms=comm_ms, comm_bytes=None, samples=samples, tokens=None))
    kept = steps[-size:]
    assert window.step_ms(50) == percentile([s for s, _, _ in kept], 50)
    assert window.step_ms(95) == percentile([s for s, _, _ in kept], 95)
    comms = [c for _, c, _ in kept if c is not None]
    assert window.mean("comm_ms") == (pytest.approx(sum(comms) / len(comms), rel=1e-6, abs=1e-6) if comms else None)
    if len(kept) >= 2:
        span = (len(kept) - 1) * 0.1
        assert window.rate("samples") == pytest.approx(sum(n for _, _, n in kept[1:]) / span, rel=1e-6)
    assert window.mean("data_ms") is None
