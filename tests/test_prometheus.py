"""The Prometheus families, as a scrape reads them: built from the job state by refresh()."""

from __future__ import annotations

import time

import builders
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ddptop.core.model.job import JobState
from ddptop.supervisor.serving.prometheus import PrometheusExporter


def scraped(state: JobState) -> dict[str, float]:
    """Each sample of a scrape, by its line's name and labels."""
    exporter = PrometheusExporter(state, 0)
    exporter.refresh()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    text = generate_latest(registry).decode()
    return {name: float(value) for line in text.splitlines() if not line.startswith("#") for name, value in [line.rsplit(" ", 1)]}


def test_a_scrape_has_the_bus_bandwidth_of_each_rank_and_the_run_s_goodput_so_far():
    """Two ranks all-reduce 1 MiB in 10 ms; the run began 42 s ago, its first step 2 s later,
    and 40 steps of 1 s followed: 40 of the 42 s were productive."""
    state = JobState()
    start = time.time() - 42.0
    state.ingest(builders.build("run", wall=start, id="r", script="job.py"))
    for rank in (0, 1):
        state.ingest(builders.hello(rank, 2))
    for n in range(40):
        for rank in (0, 1):
            sampled = {"comm_ms": 10.0, "compute_ms": 20.0, "comm_bytes": 1 << 20} if n == 39 else {}
            state.ingest(builders.step(rank, n, wall=start + 3.0 + n, step_ms=1000.0, **sampled))
    lines = scraped(state)
    for rank in (0, 1):
        key = f'ddptop_rank_bus_bandwidth_bytes_per_second{{host="h",node="0",rank="{rank}"}}'
        assert lines[key] == pytest.approx((1 << 20) / 0.010)
    assert lines['ddptop_goodput_seconds{part="productive"}'] == 40.0 and lines['ddptop_goodput_seconds{part="startup"}'] == 2.0
    assert 0.9 < lines["ddptop_goodput_ratio"] <= 0.9524  # 40 of 42 s, and the time since the last step


def test_a_job_not_started_has_no_goodput_yet():
    assert not [name for name in scraped(JobState()) if name.startswith("ddptop_goodput")]
