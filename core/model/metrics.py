"""The table of per-rank metrics: the one place that says what a metric is
and where it shows.

Each row names a metric and says how a rank's value is read from its state,
its unit, how it reads as text, how the job's figure is taken from the
ranks' (sum, median or max), and where it appears: a column of the rank
table, a Prometheus family, a plot, a part of the headless summary line.
The rank table, the exporter, the plots and the summary line iterate this
table; none of them names a metric. Adding one is a row here plus the place
it is measured (a field of the step record, kept by RankState or its
rolling window).

Rows that share a column header, a plot title or a summary template are
shown together, in table order: a column joins its metrics' texts with "/"
(step time p50/p95), a chart draws a line for each of its metrics that has
values (the step time and the comm time under it), a summary template takes one "{}"
per metric (comm ms and its share of the step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ddptop.core.format import bandwidth, count, ms, nbytes, significant
from ddptop.core.model.rank import RankState
from ddptop.core.model.stats import median


def number(fmt: str) -> Callable[[float | None], str]:
    """A format for a plain number, "-" when not measured."""
    return lambda value: "-" if value is None else fmt.format(value)


def total(values: Sequence[float]) -> float | None:
    return sum(values) if values else None


def highest(values: Sequence[float]) -> float | None:
    return max(values) if values else None


def middle(values: Sequence[float]) -> float | None:
    return median(list(values))


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Prometheus:
    """A metric's Prometheus family: its name after `ddptop_rank_`, in base units."""

    name: str
    doc: str
    scale: float = 1.0
    """Multiplies the value into the family's base unit (ms to seconds: 0.001)."""
    labels: tuple[tuple[str, str], ...] = ()
    """Labels beyond rank, node and host that tell rows of one family apart."""


Plot = Literal["throughput", "step time", "loss", "memory"]
"""The job charts a metric can be drawn in (tui/widgets/charts.py adds the per-rank "ranks" chart)."""

Jobs = Literal["launched", "all", "outside"]
"""Which jobs' rank tables show a column: "launched", measured inside the rank (steps, loss,
comm); "all", read from outside its process by psutil or NVML, which is all that a job
ddptop did not launch has; "outside", only for those, where little else is known (threads)."""


@dataclass(frozen=True)
class Metric:
    key: str
    """The metric's name in summary records and exports; the rank table's sort key."""
    unit: str
    read: Callable[[RankState], float | None]
    text: Callable[[float | None], str]
    job: Callable[[Sequence[float]], float | None] | None = None
    """How the ranks' values make the job's; None: no job figure."""
    column: str | None = None
    cell: Callable[[RankState], str] | None = None
    """The column's text when it says more than the value (a memory bar)."""
    prometheus: Prometheus | None = None
    plot: Plot | None = None
    summary: str | None = None
    data_parallel: bool = False
    """The job's figure counts each sample once: a rank's value weighs by its share of the
    job's data (RankState.data_share), where ranks of other pipeline stages or tensor-parallel
    shards saw the same samples."""
    optional: bool = False
    """Its column is left out of the rank table until a rank has it (tokens/s: language models only;
    the GPU's figures: GPU jobs only)."""
    jobs: Jobs = "launched"
    """The jobs whose rank table has its column (Jobs)."""
    running: bool = False
    """The job's figure is what its running ranks make or hold now: while the job runs, a rank
    whose process has ended counts no more (throughput it no longer makes, memory it no longer
    holds, through a restart's gap); once the job has ended, every rank's last value, for the
    final figures."""

    def format(self, rank: RankState) -> str:
        return self.cell(rank) if self.cell is not None else self.text(self.read(rank))


def _mean(attr: str) -> Callable[[RankState], float | None]:
    return lambda rank: rank.window.mean(attr)


def _sampled(key: str) -> Callable[[RankState], float | None]:
    return lambda rank: rank.sampled(key)


def _latest(key: str) -> Callable[[RankState], float | None]:
    return lambda rank: rank.latest.get(key)


def _gpu_used(rank: RankState) -> float | None:
    """What the rank holds on its GPU: NVML's per-process figure, else the allocator's reserve."""
    return rank.gpu_mem if rank.gpu_mem is not None else rank.latest.get("mem_reserved")


def _gpu_memory_bar(rank: RankState) -> str:
    used = _gpu_used(rank)
    total_bytes = rank.gpu_reading.mem_total if rank.gpu_reading is not None else None
    if not total_bytes or used is None:
        return nbytes(used)
    filled = round(8 * used / total_bytes)
    return f"{'█' * filled}{'░' * (8 - filled)} {nbytes(used)} pk {nbytes(rank.latest.get('mem_peak'))}/{nbytes(total_bytes)}"


def _gpu_util(rank: RankState) -> float | None:
    return rank.gpu_reading.util if rank.gpu_reading is not None else None


STEP_COLUMN = "STEP MS p50/95"
STEP_SUMMARY = "step {}/{} ms p50/p95"
COMM_SUMMARY = "comm {} ms ({})"

SAMPLES_PER_S = Metric(
    "samples_per_s",
    "samples/s",
    lambda r: r.rate("samples"),
    count,
    job=total,
    data_parallel=True,
    running=True,
    column="SAMPLES/S",
    prometheus=Prometheus("samples_per_second", "samples per second over the recent steps"),
    plot="throughput",
    summary="{} samples/s",
)
TOKENS_PER_S = Metric(
    "tokens_per_s",
    "tokens/s",
    lambda r: r.rate("tokens"),
    count,
    job=total,
    data_parallel=True,
    running=True,
    column="TOKENS/S",
    prometheus=Prometheus("tokens_per_second", "tokens per second over the recent steps"),
    summary="{} tokens/s",
    optional=True,
)
STEP_MS_P50 = Metric(
    "step_ms_p50",
    "ms",
    lambda r: r.window.step_ms(50),
    ms,
    job=middle,
    column=STEP_COLUMN,
    prometheus=Prometheus("step_seconds", "step time over the recent steps, by quantile", 1e-3, (("quantile", "0.5"),)),
    plot="step time",
    summary=STEP_SUMMARY,
)
STEP_MS_P95 = Metric(
    "step_ms_p95",
    "ms",
    lambda r: r.window.step_ms(95),
    ms,
    job=highest,
    column=STEP_COLUMN,
    prometheus=Prometheus("step_seconds", "step time over the recent steps, by quantile", 1e-3, (("quantile", "0.95"),)),
    summary=STEP_SUMMARY,
)
COMM_MS = Metric(
    "comm_ms",
    "ms",
    _sampled("comm_ms"),
    ms,
    job=middle,
    column="COMM MS",
    prometheus=Prometheus(
        "comm_seconds", "mean time per step in gradient all-reduce (DDP) or in the collectives of the steps timed (sharded jobs)", 1e-3
    ),
    plot="step time",
    summary=COMM_SUMMARY,
)
COMM_SHARE = Metric(
    "comm_share",
    "ratio",
    RankState.comm_share,
    number("{:.0%}"),
    job=middle,
    column="COMM %",
    prometheus=Prometheus(
        "comm_share_ratio", "share of the gradient all-reduce in the compute and communication of the steps DDP timed, data wait left out"
    ),
    summary=COMM_SUMMARY,
)
BUS_BANDWIDTH = Metric(
    "busbw",
    "bytes/s",
    RankState.bus_bandwidth,
    bandwidth,
    job=middle,
    prometheus=Prometheus(
        "bus_bandwidth_bytes_per_second",
        "gradient all-reduce bus bandwidth as nccl-tests defines it, over DDP's comm time (which counts the backward it overlaps: a floor)",
    ),
    summary="busbw {}",
)
DATA_MS = Metric(
    "data_ms",
    "ms",
    _mean("data_ms"),
    ms,
    column="DATA MS",
    prometheus=Prometheus("data_wait_seconds", "mean wait for data before a step's forward", 1e-3),
)
LOSS = Metric(
    "loss",
    "",
    _latest("loss"),
    significant(4),
    job=mean,
    column="LOSS",
    prometheus=Prometheus("loss", "the last step's loss: what backward() was called on, or what the script reported"),
    plot="loss",
    summary="loss {}",
)
GRAD_NORM = Metric(
    "grad_norm",
    "",
    _latest("grad_norm"),
    significant(3),
    column="GRAD NORM",
    prometheus=Prometheus("grad_norm", "the last global gradient norm before clipping"),
)
LEARNING_RATE = Metric(
    "lr",
    "",
    _latest("lr"),
    significant(3),
    job=middle,
    prometheus=Prometheus("learning_rate", "the learning rate of the optimizer's first parameter group"),
    summary="lr {}",
)
# Optional: a CPU job has no GPU figures, and their empty columns would push CPU % and RSS off a narrow screen.
GPU_UTIL = Metric("gpu_util", "percent", _gpu_util, number("{:.0f}"), column="GPU %", optional=True, jobs="all")
GPU_USED = Metric("gpu_used", "bytes", _gpu_used, nbytes, column="GPU MEM used pk/total", cell=_gpu_memory_bar, optional=True, jobs="all")
GPU_ALLOCATED = Metric(
    "gpu_mem",
    "bytes",
    _latest("mem_alloc"),
    nbytes,
    job=highest,
    prometheus=Prometheus("gpu_memory_allocated_bytes", "GPU memory allocated by the rank's tensors"),
    plot="memory",
    summary="gpu mem {}",
)
GPU_RESERVED = Metric(
    "gpu_reserved",
    "bytes",
    _latest("mem_reserved"),
    nbytes,
    prometheus=Prometheus("gpu_memory_reserved_bytes", "GPU memory reserved by the rank's caching allocator"),
)
GPU_PEAK = Metric(
    "gpu_peak",
    "bytes",
    _latest("mem_peak"),
    nbytes,
    prometheus=Prometheus("gpu_memory_peak_bytes", "peak GPU memory allocated by the rank"),
)
CPU_PERCENT = Metric(
    "cpu_percent",
    "percent",
    lambda r: r.cpu_percent,
    number("{:.0f}"),
    column="CPU %",
    prometheus=Prometheus("cpu_percent", "CPU use of the rank's process, percent of one core"),
    jobs="all",
)
RSS = Metric(
    "rss",
    "bytes",
    lambda r: r.rss,
    nbytes,
    job=total,
    running=True,
    column="RSS",
    prometheus=Prometheus("resident_memory_bytes", "resident memory of the rank's process"),
    plot="memory",
    summary="rss {}",
    jobs="all",
)
THREADS = Metric(
    "threads",
    "",
    lambda r: r.threads,
    number("{:.0f}"),
    column="THREADS",
    prometheus=Prometheus("threads", "threads of the rank's process"),
    jobs="outside",
)

METRICS: tuple[Metric, ...] = (
    SAMPLES_PER_S,
    TOKENS_PER_S,
    STEP_MS_P50,
    STEP_MS_P95,
    COMM_MS,
    COMM_SHARE,
    BUS_BANDWIDTH,
    DATA_MS,
    LOSS,
    GRAD_NORM,
    LEARNING_RATE,
    GPU_UTIL,
    GPU_USED,
    GPU_ALLOCATED,
    GPU_RESERVED,
    GPU_PEAK,
    CPU_PERCENT,
    RSS,
    THREADS,
)
"""In the order columns, plots and summary parts appear."""

JOB_METRICS: tuple[Metric, ...] = tuple(m for m in METRICS if m.job is not None)


def grouped(by: Callable[[Metric], str | None]) -> list[tuple[str, list[Metric]]]:
    """The metrics that share a column, plot, summary template or Prometheus family (what `by`
    names for each; None: it has none), in table order."""
    groups: dict[str, list[Metric]] = {}
    for metric in METRICS:
        if (name := by(metric)) is not None:
            groups.setdefault(name, []).append(metric)
    return list(groups.items())
