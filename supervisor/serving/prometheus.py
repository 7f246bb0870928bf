"""The Prometheus endpoint (--prometheus): per-rank, per-GPU and alert figures.

prometheus-client serves HTTP from its own thread. The metric families are
built on the supervisor's loop once a second (`refresh`) and swapped in
whole, so a scrape never reads the job state while the loop changes it, and
a slow scraper never touches the loop. Names follow Prometheus conventions:
base units (seconds, bytes, ratios), `_total` for counters, and the labels
rank, node and host on rank series, node and gpu on GPU series.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.core import Metric as Family

from ddptop.core.model.goodput import PARTS
from ddptop.core.model.job import JobState
from ddptop.core.model.metrics import SAMPLES_PER_S, grouped
from ddptop.core.model.rank import RankState

RANK_LABELS = ["rank", "node", "host"]
GPU_LABELS = ["node", "gpu", "name"]

RANK_STATE: list[tuple[str, str, Callable[[RankState], float]]] = [
    ("up", "1 while the rank's process runs, 0 once it has ended", lambda r: 0.0 if r.exited else 1.0),
    ("step", "the last step the rank finished", lambda r: float(r.step)),
]
"""What the rank is rather than what it measures; its measurements are the metric table's."""


RANK_FAMILIES = grouped(lambda metric: metric.prometheus.name if metric.prometheus is not None else None)
"""The metric table's Prometheus families: metrics that share a name are its rows (the step-time quantiles)."""
RANK_COUNTERS: list[tuple[str, str, Callable[[RankState], float]]] = [
    ("nan_skipped_steps", "steps skipped because of non-finite loss or gradients", lambda r: r.nan_skips),
    ("dropped_records", "records the rank dropped because the supervisor could not keep up", lambda r: r.dropped),
    ("data_problems", "frames refused from the rank and records contradicting earlier ones", lambda r: r.data_problems),
]
GPU_GAUGES: list[tuple[str, str, str]] = [
    ("utilization_ratio", "GPU utilisation (NVML), 0 to 1", "util"),
    ("memory_used_bytes", "GPU memory in use (NVML)", "mem_used"),
    ("memory_total_bytes", "GPU memory in total (NVML)", "mem_total"),
    ("temperature_celsius", "GPU temperature (NVML)", "temperature"),
    ("power_watts", "GPU power draw (NVML)", "power_w"),
]


def goodput_families(state: JobState, now: float) -> list[Family]:
    """The run's goodput so far, as its dashboard's header and `ddptop ls` give it: the share,
    and its wall time by part (a stacked chart of where the time went); none before it starts."""
    split = state.goodput.split(now)
    if split is None:
        return []
    ratio = GaugeMetricFamily("ddptop_goodput_ratio", "productive steps' share of the run's wall time so far", value=split["goodput"])
    seconds = GaugeMetricFamily("ddptop_goodput_seconds", "the run's wall time so far, by where it went", labels=["part"])
    for part in PARTS:
        seconds.add_metric([part], split[f"{part}_s"])
    return [ratio, seconds]


class PrometheusExporter:
    def __init__(self, state: JobState, node: int) -> None:
        self.state = state
        self.node = node
        self._families: list[Family] = []
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)
        self._server: Any = None

    def start(self, host: str, port: int) -> None:
        self._server, _ = start_http_server(port, host, registry=self._registry)

    @property
    def port(self) -> int | None:
        return None if self._server is None else int(self._server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def collect(self) -> Iterator[Family]:
        """Called from the HTTP thread: the families of the last refresh."""
        return iter(self._families)

    def refresh(self) -> None:
        """On the supervisor's loop: build every family from the state now."""
        families: list[Family] = []
        ranks = sorted(self.state.ranks.values(), key=lambda r: r.rank)
        for name, doc, state_of in RANK_STATE:
            family = GaugeMetricFamily(f"ddptop_rank_{name}", doc, labels=RANK_LABELS)
            for rank in ranks:
                family.add_metric([str(rank.rank), str(rank.node), rank.host], state_of(rank))
            families.append(family)
        for name, metrics in RANK_FAMILIES:
            first = metrics[0].prometheus
            assert first is not None
            family = GaugeMetricFamily(f"ddptop_rank_{name}", first.doc, labels=[*RANK_LABELS, *(k for k, _ in first.labels)])
            for metric in metrics:
                spec = metric.prometheus
                assert spec is not None
                for rank in ranks:
                    if (value := metric.read(rank)) is not None:
                        family.add_metric([str(rank.rank), str(rank.node), rank.host, *(v for _, v in spec.labels)], value * spec.scale)
            families.append(family)
        for name, doc, count in RANK_COUNTERS:
            counter = CounterMetricFamily(f"ddptop_rank_{name}", doc, labels=RANK_LABELS)
            for rank in ranks:
                counter.add_metric([str(rank.rank), str(rank.node), rank.host], float(count(rank)))
            families.append(counter)
        for name, doc, attr in GPU_GAUGES:
            family = GaugeMetricFamily(f"ddptop_gpu_{name}", doc, labels=GPU_LABELS)
            for (node, index), gpu in sorted(self.state.gpus.items()):
                if (value := getattr(gpu, attr)) is not None:
                    family.add_metric([str(node), str(index), gpu.name], value / 100.0 if attr == "util" else float(value))
            families.append(family)
        alerts = CounterMetricFamily("ddptop_alerts", "watchdog verdicts, by kind", labels=["kind"])
        for kind, n in sorted(self.state.alert_kinds.items()):
            alerts.add_metric([kind], float(n))
        families.append(alerts)
        families.append(CounterMetricFamily("ddptop_restarts", "restarts of the worker group", value=float(self.state.restarts)))
        families.append(GaugeMetricFamily("ddptop_world_size", "ranks in the job", value=float(self.state.world_size)))
        if (rate := self.state.totals().of(SAMPLES_PER_S)) is not None:
            families.append(GaugeMetricFamily("ddptop_samples_per_second", "samples per second of the whole job", value=rate))
        families += goodput_families(self.state, time.time())
        self._families = families
