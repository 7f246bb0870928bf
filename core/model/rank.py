"""One rank as the job model keeps it, and the GPU it runs on.

The per-rank figures the dashboard, the summary line and Prometheus show are
read from these by the metric table (metrics.py), not by each of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.core.model.stats import RollingWindow


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
    where: str | None = None
    """The main thread's innermost frame of the script's own code, as of the last heartbeat."""
    inside: str | None = None
    """The torch.distributed call the main thread is in, as of the last heartbeat."""
    live_stack: list[str] = field(default_factory=list)
    """The main thread's frames, outermost first, as of the last heartbeat that changed them."""
    dropped: int = 0
    last_wall: float = 0.0
    latest: dict[str, float] = field(default_factory=dict)
    """The last value of each per-step value kept "latest" (wire/records.py STEP_VALUES: loss, grad norm, GPU memory...)."""
    cpu_percent: float | None = None
    rss: int | None = None
    gpu: tuple[int, int] | None = None
    """(node, index) of its GPU: GPU indices repeat on every node."""
    gpu_reading: GpuState | None = None
    """That GPU's last NVML reading, shared with the job's view of the GPU."""
    gpu_mem: int | None = None
    gpu_uuid: str | None = None
    """Its GPU's UUID as it told (records.Heartbeat): how its GPU memory is found in a container."""
    steps_seen: int = 0
    nan_skips: int = 0
    scaler_skips: int = 0
    clipped: int = 0
    clip_checked: int = 0
    alerts: int = 0
    data_problems: int = 0
    """Frames refused from this rank, and records that contradict its earlier ones."""
    exited: bool = False
    stack: str | None = None
    log_tail: list[str] | None = None
    """The end of its own log, as its node last sent it (at a dashboard's asking)."""
    window: RollingWindow = field(default_factory=RollingWindow)
    interval_step_ms: float = 0.0
    """Step time summed over the steps finished since the last summary record (history.py)."""
    interval_comm_ms: float = 0.0
    interval_steps: int = 0
    interval_comm_steps: int = 0

    def comm_share(self) -> float | None:
        comm, step = self.window.mean("comm_ms"), self.window.mean("step_ms")
        return comm / step if comm is not None and step else None

    def busy_ms(self) -> float | None:
        """The median step's own work: its data wait and compute, not its wait in the all-reduce.

        In DDP every rank's step takes as long as the slowest one's, because
        the fast ones wait for it in the all-reduce; what sets a straggler
        apart is that its time is its own, not waiting. The compute is what
        DDP times on its sampled iterations (stats._busy), the same iterations
        on every rank. The median, not the mean: a straggler is slower on
        most steps, and one long step (rank 0 evaluating alone between two
        steps) is a pause, not a slow rank.
        """
        return self.window.busy_ms(50)

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
