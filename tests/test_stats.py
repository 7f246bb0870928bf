import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddptop.core.model.stats import RollingWindow, StepPoint, bus_bandwidth, percentile


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile(values, 100) == 100
    assert percentile([], 50) is None


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


def test_time_left_out_twice_is_taken_from_the_rates_span_once():
    """A paused step (skip) that held an evaluation its record also told: the evaluation's span
    lies inside the step's, and the rate leaves the step's time out once."""
    window = RollingWindow(size=100)
    for n in range(10):
        window.add(StepPoint(1.0 + 0.1 * n, 100.0, samples=10))
    window.skip(7.9, 6000.0)  # the step from 1.9 to 7.9 (after the first ten)...
    window.skip(6.5, 4000.0)  # ...held an evaluation of 4 s, from 2.5 to 6.5
    for n in range(10):
        window.add(StepPoint(8.0 + 0.1 * n, 100.0, samples=10))
    assert window.rate("samples") == pytest.approx(100.0)


def steady(window: RollingWindow, steps: int = 10, start: float = 1.0) -> None:
    """Steps of 100 ms and 10 samples each, ending at start + 0.1 n."""
    for n in range(steps):
        window.add(StepPoint(start + 0.1 * n, 100.0, samples=10))


def test_a_step_open_past_the_slowest_one_counts_in_the_rate_and_a_steady_one_does_not():
    """A rank stuck for 9 s after its last step has made nothing for that long: the rate over
    its window falls to its steps' samples over their span and the 9 s past the slowest step.
    A heartbeat inside a step no slower than the window's leaves the rate as its steps say."""
    window = RollingWindow(size=100)
    steady(window)
    assert window.rate("samples", until=1.9 + 0.08) == pytest.approx(100.0)
    assert window.rate("samples", until=1.9 + 0.1) == pytest.approx(100.0)
    assert window.rate("samples", until=1.9 + 9.1) == pytest.approx(90 / (0.9 + 9.0))
    assert window.rate("samples", until=None) == pytest.approx(100.0)


def test_an_open_step_is_counted_from_time_left_out_after_the_last_step():
    """A step held for a pause is not added, its time left out (skip): a heartbeat just after it
    finds the rank stepping again, not open since the step before the pause."""
    window = RollingWindow(size=100)
    steady(window)
    window.skip(31.9, 30_000.0)
    assert window.rate("samples", until=31.95) == pytest.approx(100.0)
    assert window.rate("samples", until=41.9 + 0.1) == pytest.approx(90 / (0.9 + 10.0))


def test_a_count_some_steps_carry_falls_the_same_when_a_step_stays_open():
    window = RollingWindow(size=100)
    for n in range(10):
        window.add(StepPoint(1.0 + 0.1 * n, 100.0, tokens=100 if n % 2 else None))
    assert window.rate("tokens", until=1.95) == pytest.approx(400 / 0.8)
    assert window.rate("tokens", until=12.0) == pytest.approx(400 / (0.8 + 10.0))
