"""One rank as the job model keeps it, and the GPU it runs on.

The per-rank figures the dashboard, the summary line and Prometheus show are
read from these by the metric table (metrics.py), not by each of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddptop.core.model.stats import RollingWindow, bus_bandwidth, median
from ddptop.core.wire.records import WindowedValue

SAMPLED: tuple[WindowedValue, ...] = ("comm_ms", "comm_overlap_ms", "comm_bytes", "compute_ms")
"""The step values that come from DDP's sampled iterations (wire/records.py), kept together."""

DDP_WARMUP_STEPS = 10
"""DDP times its iterations 1 to 10, then about one a second (trainer/sampled.py): the first ten
are its warm-up (the first backward builds autograd's graph and the allocator's pools), no
rank's steady pace."""
COMPUTE_SAMPLES = 3
"""The sampled compute times a rank's estimate is the median of."""
SHARDED_COMPUTE_SAMPLES = 9
"""Of a sharded rank, the most it is the median of, once it has COMPUTE_SAMPLES: its compute is
its timed step less the waits (trainer/collective_timer.py), which holds every delay of the
rank's own on a busy host (a descheduled process, the optimizer), where DDP's reducer times
the forward and backward alone."""


@dataclass
class GpuState:
    index: int
    name: str = ""
    util: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    temperature: float | None = None
    power_w: float | None = None


@dataclass
class RankState:
    rank: int
    local_rank: int = 0
    node: int = 0
    host: str = ""
    pid: int = 0
    restart: int = 0
    step: int = -1
    phase: str = "startup"
    phase_step: int = -1
    """The step in progress when the phase was told: a rank whose steps are shorter than the
    heartbeat's second is seldom still in the phase its last heartbeat told."""
    where: str | None = None
    """The main thread's innermost frame of the script's own code, as of the last heartbeat."""
    inside: str | None = None
    """The torch.distributed call the main thread is in, as of the last heartbeat."""
    live_stack: list[str] = field(default_factory=list)
    """The main thread's frames, outermost first, as of the last heartbeat that changed them."""
    dropped: int = 0
    last_wall: float = 0.0
    latest: dict[str, float] = field(default_factory=dict)
    """The last value of each per-step value kept "latest" (wire/records.py LATEST: loss, grad norm, GPU memory...)."""
    cpu_percent: float | None = None
    rss: int | None = None
    threads: int | None = None
    gpu: tuple[int, int] | None = None
    """(node, index) of its GPU: GPU indices repeat on every node."""
    gpu_reading: GpuState | None = None
    """That GPU's last NVML reading, shared with the job's view of the GPU."""
    gpu_mem: int | None = None
    gpu_uuid: str | None = None
    """Its GPU's UUID as it told (records.Heartbeat): how its GPU memory is found in a container."""
    world_size: int = 0
    """The ranks of the job, as its hello told."""
    replicas: tuple[int, ...] | None = None
    """The ranks this rank is data-parallel with, where that is part of the job
    (records.Heartbeat replicas): a pipeline stage's or a tensor-parallel shard's. They do its
    work on other samples, which the other groups' ranks do not; None: every rank."""
    batch_shared: int = 1
    """How many ranks are given its batch (records.Heartbeat batch_shared): its tensor-parallel
    group, where tensor parallelism alone splits the model over the job."""
    steps_seen: int = 0
    nan_skips: int = 0
    scaler_skips: int = 0
    clipped: int = 0
    clip_checked: int = 0
    last_sampled: dict[str, float] = field(default_factory=dict)
    """The comm figures of the last step record that carried DDP's sampled timings (SAMPLED):
    shown while the window holds none. DDP samples one iteration in 100, the window's length,
    and its figures ride on a step up to two seconds later, so a window often holds none."""
    comm_dims: dict[str, dict[str, float]] = field(default_factory=dict)
    """Of a sharded rank, its last timed step's comm per mesh dimension, per op (records.Step comm_dims)."""
    compute_samples: list[float] = field(default_factory=list)
    """DDP's last sampled compute times, past its warm-up (add_compute), kept past the window:
    they are 100 iterations apart."""
    alerts: int = 0
    data_problems: int = 0
    """Frames refused from this rank, and records that contradict its earlier ones."""
    exited: bool = False
    stack: str | None = None
    """Its last stack dump's text (a stall's, or one a dashboard asked for)."""
    stack_source: str = ""
    """What dumped it: "py-spy --native", "faulthandler"..."""
    stack_wall: float = 0.0
    """When."""
    log_tail: list[str] | None = None
    """The end of its own log, as its node last sent it (at a dashboard's asking)."""
    window: RollingWindow = field(default_factory=RollingWindow)
    paused_at: float | None = None
    """When the watchdog told of a pause (rank 0 evaluating alone while the others wait) that
    this rank has finished no step since: the step it is in holds the pause, and stays out of
    the window, or its rates and means would read an evaluation as slow data or slow training."""
    interval_step_ms: float = 0.0
    """Step time summed over the steps finished since the last summary record (history.py)."""
    interval_comm_ms: float = 0.0
    interval_steps: int = 0
    interval_comm_steps: int = 0

    def sampled(self, key: str) -> float | None:
        """A figure of DDP's sampled iterations (SAMPLED): the window's mean, else the last one seen."""
        return self._sampled_figures()(key)

    def _sampled_figures(self) -> Callable[[str], float | None]:
        """Where the sampled figures are read, all from one place: the window while it holds a
        sampled step, else the last sampled step (a share of one iteration's figures and
        another's would be neither's)."""
        return self.window.mean if self.window.mean("comm_ms") is not None else self.last_sampled.get

    def rate(self, attr: str) -> float | None:
        """Per-second rate of a count (samples, tokens) over its recent steps, to its last
        heartbeat while it runs (RollingWindow.rate): one that stopped stepping falls. Once
        it has exited, the rate its steps ended at stands."""
        running = not self.exited and self.phase != "exit"
        return self.window.rate(attr, self.last_wall if running else None)

    def data_share(self, world: int) -> float:
        """The share of the job's samples this rank's count stands for. Where it is
        data-parallel with part of the job (each pipeline stage or tensor-parallel shard over
        its own group), a sample passes through a rank of every group: the ranks of one group
        count each once, replicas of the world's ranks. Where tensor parallelism alone splits the
        model, every rank of its group is given the same batch: each counts its share of it."""
        share = 1.0 if self.replicas is None or world <= 0 else min(1.0, len(self.replicas) / world)
        return share / max(1, self.batch_shared)

    def comm_share(self) -> float | None:
        """The all-reduce's share of a step: of the iterations DDP sampled, their comm against
        their own time (compute, then comm less what ran beside the compute). Comm is only
        measured on those iterations, and on a busy host one of them can outlast the typical
        step several times over: against the mean of all steps it would read over 100%. Comm
        recorded without DDP's compute (a run of an earlier ddptop, replayed) is taken against
        the mean step."""
        figures = self._sampled_figures()
        comm = figures("comm_ms")
        if comm is None:
            return None
        compute = figures("compute_ms")
        if compute is None:
            step = self.window.mean("step_ms")
            return comm / step if step else None
        # DDP can time more overlap than compute (a model whose sampled iteration's backward
        # was another model's, a GAN's discriminator in its generator's step): never over 100%.
        spent = max(compute + comm - (figures("comm_overlap_ms") or 0.0), comm)
        return comm / spent if spent > 0 else None

    def bus_bandwidth(self) -> float | None:
        """Its gradient all-reduce's bus bandwidth as nccl-tests defines it, over the iterations DDP
        sampled: the bytes of its buckets over DDP's comm time, times 2(n-1)/n for the n ranks it
        all-reduces with (its replicas, or the job). DDP's comm time runs from the first bucket's
        all-reduce to the last's end, through the backward it overlaps and any wait for a late
        rank, so this is a floor on what the links carry: near it where the all-reduce is
        exposed, well under it where the backward hides it. None for a rank that all-reduces
        with no other."""
        figures = self._sampled_figures()
        comm_ms, nbytes = figures("comm_ms"), figures("comm_bytes")
        over = len(self.replicas) if self.replicas else self.world_size
        if not comm_ms or not nbytes or over < 2:
            return None
        return bus_bandwidth(nbytes, comm_ms / 1000.0, over)

    def add_compute(self, compute_ms: float, comm_step: int | None, kept: int = COMPUTE_SAMPLES) -> None:
        """One of DDP's sampled compute times (or a sharded step's: kept SHARDED_COMPUTE_SAMPLES),
        unless its warm-up's (a record without the step it measured is taken as steady)."""
        if comm_step is None or comm_step >= DDP_WARMUP_STEPS:
            self.compute_samples = [*self.compute_samples[1 - kept :], compute_ms]

    def compute_ms(self) -> float | None:
        """Its compute per step: the median of the samples kept, once it has COMPUTE_SAMPLES.
        One sample is one iteration, and on a busy host one unlucky iteration is several
        times the others' (a descheduled process); a straggler is slow on most."""
        if len(self.compute_samples) < COMPUTE_SAMPLES:
            return None
        return median(self.compute_samples)

    def interval(self) -> tuple[float, float]:
        """Mean step and comm time of the steps since the last summary; NaN where none."""
        nan = float("nan")
        step = self.interval_step_ms / self.interval_steps if self.interval_steps else nan
        comm = self.interval_comm_ms / self.interval_comm_steps if self.interval_comm_steps else nan
        return step, comm

    def start_interval(self) -> None:
        self.interval_step_ms = self.interval_comm_ms = 0.0
        self.interval_steps = self.interval_comm_steps = 0

    def clip_rate(self) -> float | None:
        return self.clipped / self.clip_checked if self.clip_checked else None


def replicas_told(value: Any) -> tuple[int, ...] | None:
    """The ranks a record says a rank is data-parallel with (`replicas`, a list on the wire), in
    order, as RankState.replicas keeps them and the rules key groups by them; None where it
    names none, or names something other than ranks."""
    if not isinstance(value, list) or not value or not all(type(r) is int for r in value):
        return None
    return tuple(sorted(set(value)))
