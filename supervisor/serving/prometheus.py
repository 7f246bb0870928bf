"""The Prometheus endpoint (--prometheus): per-rank, per-GPU and alert figures.

prometheus-client serves HTTP from its own thread. The metric families are
built on the supervisor's loop once a second (`refresh`) and swapped in
whole, so a scrape never reads the job state while the loop changes it, and
a slow scraper never touches the loop. Names follow Prometheus conventions:
base units (seconds, bytes, ratios), `_total` for counters, and the labels
rank, node and host on rank series, node and gpu on GPU series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ddptop.core.model.job import JobState, RankState

RANK_LABELS = ["rank", "node", "host"]
GPU_LABELS = ["node", "gpu", "name"]


def _ms_to_s(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


RANK_GAUGES: list[tuple[str, str, Callable[[RankState], float | None]]] = [
    ("up", "1 while the rank's process runs, 0 once it has ended", lambda r: 0.0 if r.exited else 1.0),
    ("step", "the last step the rank finished", lambda r: float(r.step)),
    ("samples_per_second", "samples per second over the recent steps", RankState.samples_per_s),
    ("data_wait_seconds", "mean wait for data before a step's forward", lambda r: _ms_to_s(r.window.mean("data_ms"))),
    ("comm_seconds", "mean time per step in gradient all-reduce", lambda r: _ms_to_s(r.window.mean("comm_ms"))),
    ("comm_share_ratio", "share of the step time spent in communication", RankState.comm_share),
    ("loss", "the last loss the script reported", lambda r: r.loss),
    ("grad_norm", "the last global gradient norm before clipping", lambda r: r.grad_norm),
    ("gpu_memory_allocated_bytes", "GPU memory allocated by the rank's tensors", lambda r: r.mem_alloc),
    ("gpu_memory_reserved_bytes", "GPU memory reserved by the rank's caching allocator", lambda r: r.mem_reserved),
    ("gpu_memory_peak_bytes", "peak GPU memory allocated by the rank", lambda r: r.mem_peak),
    ("cpu_percent", "CPU use of the rank's process, percent of one core", lambda r: r.cpu_percent),
    ("resident_memory_bytes", "resident memory of the rank's process", lambda r: r.rss),
]
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


class PrometheusExporter:
    def __init__(self, state: JobState, node: int) -> None:
        self.state = state
        self.node = node
        self._families: list[Metric] = []
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)  # type: ignore[arg-type]
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

    def collect(self) -> Iterator[Metric]:
        """Called from the HTTP thread: the families of the last refresh."""
        return iter(self._families)

    def refresh(self) -> None:
        """On the supervisor's loop: build every family from the state now."""
        families: list[Metric] = []
        ranks = sorted(self.state.ranks.values(), key=lambda r: r.rank)
        for name, doc, read in RANK_GAUGES:
            family = GaugeMetricFamily(f"ddptop_rank_{name}", doc, labels=RANK_LABELS)
            for rank in ranks:
                if (value := read(rank)) is not None:
                    family.add_metric([str(rank.rank), str(rank.node), rank.host], float(value))
            families.append(family)
        step = GaugeMetricFamily("ddptop_rank_step_seconds", "step time over the recent steps, by quantile", labels=[*RANK_LABELS, "quantile"])
        for rank in ranks:
            for q in (50, 95):
                if (ms := rank.window.step_ms(q)) is not None:
                    step.add_metric([str(rank.rank), str(rank.node), rank.host, f"{q / 100:g}"], ms / 1000.0)
        families.append(step)
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
        for kind, count in sorted(self.state.alert_kinds.items()):
            alerts.add_metric([kind], float(count))
        families.append(alerts)
        families.append(CounterMetricFamily("ddptop_restarts", "restarts of the worker group", value=float(self.state.restarts)))
        families.append(GaugeMetricFamily("ddptop_world_size", "ranks in the job", value=float(self.state.world_size)))
        totals = self.state.totals()
        if totals["samples_per_s"] is not None:
            families.append(GaugeMetricFamily("ddptop_samples_per_second", "samples per second of the whole job", value=totals["samples_per_s"]))
        self._families = families
