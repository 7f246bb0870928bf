"""Where a job's records are aggregated: per-rank state and job totals.

One plain model, fed record by record, serves every consumer: the headless
supervisor's summaries, and the dashboard whether its records come live from
a socket or from a finished run's event log. So launch, attach and replay
show the same figures computed the same way.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from ddptop.core import wire
from ddptop.core.model import profiles, snapshot
from ddptop.core.model.goodput import GOODPUT_TYPES, Goodput
from ddptop.core.model.history import History, pack
from ddptop.core.model.lag import Lag, counts_compute, lags
from ddptop.core.model.metrics import JOB_METRICS, Metric
from ddptop.core.model.rank import COMPUTE_SAMPLES, SAMPLED, SHARDED_COMPUTE_SAMPLES, GpuState, RankState, replicas_told
from ddptop.core.model.sharded_norm import ShardedNorm
from ddptop.core.model.stats import RollingWindow, StepPoint, median
from ddptop.core.model.totals import JobTotals
from ddptop.core.wire import records
from ddptop.core.wire.records import LATEST, WINDOWED

Ingested = wire.Record | snapshot.SnapshotFrame
"""What a JobState folds: records, and the frames of a snapshot of another JobState."""
EVENT_TYPES = frozenset({"alert", "action", "notice", "wire_error", "exit", "group_restart", "capture"})
"""Records the dashboard's alert panel lists."""


class JobState:
    def __init__(self) -> None:
        self.ranks: dict[int, RankState] = {}
        self.gpus: dict[tuple[int, int], GpuState] = {}
        """(node, index) -> the GPU's last reading; node is the sampling supervisor's."""
        self.meta: Mapping[str, Any] = {}
        """The run record, once it came (records.Run): the launch's metadata."""
        self.world_size = 0
        self.total_steps: int | None = None
        self.started = time.time()
        self.last_wall = self.started
        self.records = 0
        self.alerts = 0
        self.alert_kinds: Counter[str] = Counter()
        self.events: deque[wire.Record] = deque(maxlen=200)
        self.history = History()
        self.exit: records.Exit | None = None
        self.checkpoint_step: int | None = None
        self.goodput = Goodput()
        self.captures: dict[str, profiles.Capture] = {}
        """Profiler captures by id (model/profiles.py), as their records told."""
        self.latest_capture: profiles.Capture | None = None
        self.snapshot_unreadable = False
        """Whether the snapshot being folded is of a layout this reader does not know (its frames are skipped)."""
        self.own_counts_compute = False
        """Whether the last summary's own work per rank counted compute (lag.counts_compute)."""
        self.sharded_norm = ShardedNorm()
        """A sharded job's grad norm, from its ranks' shares of each step's."""
        self.sharded = False
        """Whether its gradients are sharded over ranks (records.Step sharded): its ranks wait for
        each other in all-gathers and reduce-scatters, not in DDP's all-reduce."""

    @property
    def outside(self) -> bool:
        """A job ddptop did not launch, watched from outside (its run record says so): its ranks
        send no steps, only what is read of their processes."""
        return self.meta.get("launch_style") == records.OUTSIDE

    def rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank)
        return state

    def ingest(self, frame: Ingested) -> None:
        """Fold one record (live or replayed), or a frame of a snapshot, into the state."""
        if frame["type"] in snapshot.SNAPSHOT_TYPES:  # a snapshot carries the count it stands for
            snapshot.restore(self, cast(snapshot.SnapshotFrame, frame))
            return
        record = cast(wire.Record, frame)
        kind = record["type"]
        self.records += 1
        if "wall" in record and record["wall"] is not None:
            self.last_wall = max(self.last_wall, record["wall"])
        if kind in EVENT_TYPES:
            self.events.append(record)
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, record)
        if kind in GOODPUT_TYPES:
            self.goodput.observe(record)

    def _on_run(self, record: records.Run) -> None:
        self.meta = record
        self.started = self.last_wall = record.get("wall", self.started)

    def _on_hello(self, record: records.RankHello) -> None:
        state = self.rank(record["rank"])
        if record["restart"] != state.restart:
            # A new attempt's figures are its own: the last one's steps would stretch its rates
            # over the restart's gap (a job that resumed at full speed read a tenth of it).
            state.window = RollingWindow()
            state.last_sampled = {}
        for key in ("local_rank", "node", "host", "pid", "restart", "world_size"):
            setattr(state, key, record[key])
        state.phase = "startup"
        state.step = -1
        state.live_stack = []
        state.compute_samples = []  # a new attempt warms up again
        state.paused_at = None  # a pause of the attempt before is over
        state.exited = False
        self.world_size = max(self.world_size, record["world_size"])

    def _on_step(self, record: records.Step) -> None:
        state = self.rank(record["rank"])
        if record["step"] <= state.step:  # within one attempt steps only go up; a resume says hello first
            state.data_problems += 1
            return
        state.step = record["step"]
        state.last_wall = record["wall"]
        state.steps_seen += 1
        if state.phase == "startup":  # it trains: a step ends in "data" (waiting for its next batch) until a heartbeat says more
            state.phase, state.phase_step = "data", record["step"] + 1
        for key in LATEST:
            if record.get(key) is not None:
                state.latest[key] = record[key]
        if record.get("sharded"):
            self.sharded = True
        if (share := record.get("grad_sq_share")) is not None:
            self._add_share(state, record["step"], share)
        skipped = record.get("skipped")
        if skipped == "nan":
            state.nan_skips += 1
        elif skipped == "scaler":
            state.scaler_skips += 1
        if record.get("clipped") is not None:
            state.clip_checked += 1
            state.clipped += record["clipped"]
        if record.get("total_steps") is not None:
            self.total_steps = record["total_steps"]
        state.interval_step_ms += record["step_ms"]
        state.interval_steps += 1
        if record.get("comm_ms") is not None:
            state.interval_comm_ms += record["comm_ms"]
            state.interval_comm_steps += 1
            state.last_sampled = {key: record[key] for key in SAMPLED if record.get(key) is not None}
        if (dims := record.get("comm_dims")) is not None:
            state.comm_dims = dims
        if record.get("compute_ms") is not None:
            kept = SHARDED_COMPUTE_SAMPLES if record.get("sharded") else COMPUTE_SAMPLES
            state.add_compute(record["compute_ms"], record.get("comm_step"), kept)
        if (ended := record.get("eval_ended")) is not None:
            # Every rank's step held it (the others waited in the all-reduce): out of every rank's rates.
            for rank in self.ranks.values():
                rank.window.skip(ended, record.get("eval_ms", 0.0))
        if state.paused_at is not None and record["wall"] >= state.paused_at:
            state.paused_at = None
            state.window.skip(record["wall"], record["step_ms"])
        else:
            state.window.add(StepPoint(record["wall"], record["step_ms"], **{key: record.get(key) for key in WINDOWED}))

    def _add_share(self, state: RankState, step: int, share: float) -> None:
        """A sharded step's rank's share of its grad norm's square: with the last rank's, the
        norm is every rank's grad norm (model/sharded_norm.py)."""
        norms = self.sharded_norm.add(state.restart, step, state.rank, share, self.world_size or 1)
        for rank, norm in (norms or {}).items():
            self.ranks[rank].latest["grad_norm"] = norm

    def _on_notice(self, record: records.Notice) -> None:
        """A pause: every rank's step in progress holds it (the pause is told while no rank finishes one)."""
        if record.get("kind") == "pause":
            for state in self.ranks.values():
                state.paused_at = record["wall"]

    def _on_heartbeat(self, record: records.Heartbeat) -> None:
        state = self.rank(record["rank"])
        state.phase, state.phase_step = record["phase"], record["step"]
        if record.get("where") is not None:  # an exiting rank sends none: where it last was stands
            state.where = record["where"]
            state.inside = record.get("inside")
        if record.get("stack") is not None:  # sent when it changed: the last one stands
            state.live_stack = record["stack"]
        state.dropped = record["dropped"]
        state.last_wall = max(state.last_wall, record["wall"])
        if record.get("gpu_uuid"):
            state.gpu_uuid = record["gpu_uuid"]
        if (replicas := replicas_told(record.get("replicas"))) is not None:
            state.replicas = replicas
        if isinstance(shared := record.get("batch_shared"), int) and shared > 0:
            state.batch_shared = shared

    def _on_sample(self, record: records.Sample) -> None:
        """One node's readings. Its GPUs first, so each of its ranks takes its GPU's new reading
        (a rank's GPU is on its own node: the other nodes' ranks have nothing new here)."""
        node = record.get("node") or 0
        for gpu in record.get("gpus", []):
            self.gpus[(node, gpu["index"])] = GpuState(**gpu)
        for proc in record.get("procs", []):
            if proc["rank"] in self.ranks:
                state = self.ranks[proc["rank"]]
                # A process that just exited has no reading: keep its last one.
                if proc.get("cpu") is not None:
                    state.cpu_percent = proc["cpu"]
                if proc.get("rss") is not None:
                    state.rss = proc["rss"]
                if proc.get("threads") is not None:
                    state.threads = proc["threads"]
                if proc.get("gpu_mem") is not None:
                    state.gpu_mem = proc["gpu_mem"]
                if proc.get("gpu") is not None:
                    state.gpu = (node, proc["gpu"])
                if state.gpu is not None:
                    state.gpu_reading = self.gpus.get(state.gpu)

    def _on_alert(self, record: records.Alert) -> None:
        self.alerts += 1
        self.history.mark(record["wall"], "alert", str(record.get("kind") or record.get("text", "")))
        self.alert_kinds[str(record.get("kind"))] += 1
        for rank in record.get("ranks") or [record.get("rank")]:
            if rank in self.ranks:
                self.ranks[rank].alerts += 1

    def _on_wire_error(self, record: records.WireError) -> None:
        if record.get("rank") in self.ranks:
            self.ranks[record["rank"]].data_problems += 1

    def _on_gone(self, record: records.RankGone) -> None:
        self.rank(record["rank"]).exited = True

    def _on_stack(self, record: records.Stack) -> None:
        rank = self.rank(record["rank"])
        rank.stack, rank.stack_source, rank.stack_wall = record.get("text"), record["source"], record["wall"]

    def _on_capture(self, record: records.Capture | records.Profile) -> None:
        self.latest_capture = profiles.fold(self.captures, record)

    def _on_log_tail(self, record: records.LogTail) -> None:
        if record["rank"] in self.ranks:
            self.ranks[record["rank"]].log_tail = record["lines"]

    def _on_checkpoint(self, record: records.Checkpoint) -> None:
        self.checkpoint_step = record["step"]

    def _on_resume(self, record: records.Resume) -> None:
        """Every rank resumes from the same file: one event for the job, from rank 0."""
        self.checkpoint_step = record["step"]
        if record["rank"] == 0:
            self.events.append(record)

    def _on_summary(self, record: records.Summary) -> None:
        self.history.add_summary(record)
        counts = bool(record.get("own_counts_compute"))
        if counts and not self.own_counts_compute:  # own work jumps by the compute here: not a slowdown
            self.history.mark(record["wall"], "compute", "own work counts compute from here")
        self.own_counts_compute = counts
        for state in self.ranks.values():
            state.start_interval()

    def _on_group_restart(self, record: records.GroupRestart) -> None:
        self.history.mark(record["wall"], "restart", "restart")

    def _on_exit(self, record: records.Exit) -> None:
        self.exit = record
        for state in self.ranks.values():
            state.exited = True

    def summary(self, wall: float) -> records.Summary:
        """The per-second summary record: the job's totals, and each rank's step and comm
        time since the last one (indexed by rank), for the charts' history."""
        record = self.totals().record(wall)
        width = max(self.ranks, default=-1) + 1
        intervals = [self.ranks[r].interval() if r in self.ranks else (float("nan"), float("nan")) for r in range(width)]
        if width:
            lags = self.lags()
            record["rank_step_ms"] = pack(step for step, _ in intervals)
            record["rank_own_ms"] = pack(lags[r].own_ms if r in lags else float("nan") for r in range(width))
            record["rank_comm_ms"] = pack(comm for _, comm in intervals)
            record["own_counts_compute"] = counts_compute(r for r in self.ranks.values() if not r.exited and r.window.points)
        return record

    @property
    def restarts(self) -> int:
        return max((r.restart for r in self.ranks.values()), default=0)

    def lags(self) -> dict[int, Lag]:
        """Each live rank's own work per step against the job's median (lag.py)."""
        return lags(self.ranks.values())

    def running(self) -> bool:
        """Whether a rank runs: one has said hello and not exited. Before the first hello the job is
        starting, which counts as running."""
        return not self.ranks or not all(rank.exited for rank in self.ranks.values())

    def steps_done(self) -> int | None:
        """Steps done, by the furthest rank: DDP's all-reduce holds the others within a step of it,
        and the nearest is only the one whose records came last (a killed rank's never come)."""
        return max((r.step + 1 for r in self.ranks.values() if r.step >= 0), default=None)

    def figure(self, metric: Metric, ranks: Iterable[RankState]) -> float | None:
        """A metric's figure over some of the job's ranks (all: the job's; a node's), as its row
        takes it (Metric.job): while the job runs, of its running ranks alone where it is what
        they make or hold now (Metric.running), each weighed by its share of the job's data
        (Metric.data_parallel)."""
        assert metric.job is not None
        of = [r for r in ranks if not (metric.running and r.exited and self.exit is None)]
        if metric.data_parallel:
            return metric.job([x * r.data_share(self.world_size) for r in of if (x := metric.read(r)) is not None])
        return metric.job([x for r in of if (x := metric.read(r)) is not None])

    def totals(self) -> JobTotals:
        """Job-wide figures: the metric table's job figures and the job's counts."""
        ranks = list(self.ranks.values())
        figures = {metric.key: self.figure(metric, ranks) for metric in JOB_METRICS}
        return JobTotals(
            ranks_seen=len(ranks),
            world_size=self.world_size,
            steps_done=self.steps_done(),
            total_steps=self.total_steps,
            dropped=sum(r.dropped for r in ranks),
            alerts=self.alerts,
            nan_skips=max((r.nan_skips for r in ranks), default=0),
            scaler_skips=max((r.scaler_skips for r in ranks), default=0),
            clip_rate=median([x for r in ranks if (x := r.clip_rate()) is not None]),
            restarts=self.restarts,
            checkpoint_step=self.checkpoint_step,
            metrics=figures,
        )


_HANDLERS: dict[str, Callable[[JobState, Any], None]] = {
    "run": JobState._on_run,
    "rank_hello": JobState._on_hello,
    "step": JobState._on_step,
    "heartbeat": JobState._on_heartbeat,
    "sample": JobState._on_sample,
    "alert": JobState._on_alert,
    "notice": JobState._on_notice,
    "summary": JobState._on_summary,
    "stack": JobState._on_stack,
    "rank_gone": JobState._on_gone,
    "wire_error": JobState._on_wire_error,
    "checkpoint": JobState._on_checkpoint,
    "log_tail": JobState._on_log_tail,
    "resume": JobState._on_resume,
    "group_restart": JobState._on_group_restart,
    "capture": JobState._on_capture,
    "profile": JobState._on_capture,
    "exit": JobState._on_exit,
}
