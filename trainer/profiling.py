"""A torch.profiler capture of a few steps of this rank, asked for by `ddptop profile` or the dashboard.

Nothing of it runs until a capture is asked for: the optimizer post-hook
reads one attribute a step (`Captures.active`), and torch.profiler is
imported at the first capture. The sender's thread hands a request over
(Captures.ask, from the supervisor's rank_command); the training thread
starts the profiler at its next step boundary, marks each boundary, and
stops it after the steps asked for, or MAX_S seconds, whichever comes
first. The trace (Chrome trace JSON, gzipped: Perfetto and chrome://tracing
open it) and its summary are made on a thread of their own, and the
`profile` record goes to the supervisor; a capture that cannot be made (the
profiler refused, no room for the trace) is such a record with an error,
and the job trains on.

The step's phases come from what DDP's reducer times in C++ (sampled.py
says what): during a capture it times every iteration (its runtime
logging sample rate held at 1, and the job's pace's given back after),
so each captured step has its forward and backward compute, its all-reduce
and how much of it overlapped the backward, device times on a GPU; the data
wait is from the previous step's end to the step's first forward, and the rest
of the step (the optimizer, zero_grad) is from the backward's end to the
step's. DDP times only the forwards that synchronise: a script that
accumulates gradients over micro-batches (no_sync) has those before the
synced one as a phase of their own, not as data wait. DDP publishes an iteration's times at the next forward, so the
capture reads one boundary past its last step.
"""

from __future__ import annotations

import gzip
import os
import shutil
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from ddptop.core import wire
from ddptop.core.wire import records
from ddptop.trainer import sampled

MAX_STEPS = 100
MAX_S = 60.0
"""A capture stops after this long, however many steps it has: it never holds a job for long."""
MAX_TRACE_BYTES = 256 << 20
"""A gzipped trace larger than this is not kept (the capture says so)."""
TOP_OPS = 15
EXPORT_WAIT_S = 10.0
"""How long a rank's exit waits for a trace still being written."""

Send = Callable[[wire.Frame], None]


class Capture:
    """One capture's state, on the training thread."""

    def __init__(self, request: records.RankCommand, rank: int, attempt: int) -> None:
        self.id: str = request["id"]
        self.steps = max(1, min(int(request["steps"]), MAX_STEPS))
        self.from_step = int(request.get("from_step", 0))
        self.folder: str = request["folder"]
        self.rank, self.attempt = rank, attempt
        self.profiler: Any = None
        self.first_step = -1
        self.taken = 0
        self.started = 0.0
        self.ends: list[tuple[int, float]] = []
        """(step, wall) at each boundary from the capture's start: the steps' spans."""
        self.firsts: dict[int, tuple[float, int]] = {}
        """Per captured step, when its first training forward began (wall) and how many it had."""
        self.timings: dict[int, dict[str, Any]] = {}
        """DDP's timings by its iteration."""
        self.stopped_early: str | None = None
        self.tail = False
        """The profiler has stopped: one more boundary, for DDP's times of the last step."""

    def record(self, **fields: Any) -> wire.Frame:
        return {
            "type": "profile",
            "rank": self.rank,
            "wall": time.time(),
            "id": self.id,
            "first_step": self.first_step,
            "steps": self.taken,
            **fields,
        }


class Captures:
    """This rank's one capture slot: the sender's thread asks, the training thread runs it."""

    def __init__(self, rank: int, attempt: int, send: Send, models: Callable[[], list[Any]] = list) -> None:
        self.rank, self.attempt, self._send = rank, attempt, send
        self.models = models
        """The rank's DDP models (probe.py sets it): their timings."""
        self.hold_rate: Callable[[int | None], None] = lambda rate: None
        """Holds the models' DDP sample rate at one during a capture, and lets it go (probe.py sets it: Sampled.hold_rate)."""
        self.active = False
        """Whether a capture waits for the next boundary or runs: the one thing a step reads."""
        self._pending: Capture | None = None
        self._running: Capture | None = None
        self._writing: threading.Thread | None = None

    def ask(self, request: records.RankCommand) -> None:
        """A rank_command to profile, on the sender's thread."""
        if self.active or (self._writing is not None and self._writing.is_alive()):
            refused = Capture(request, self.rank, self.attempt)
            self._send(refused.record(error="this rank is already capturing: one capture at a time"))
            return
        self._pending = Capture(request, self.rank, self.attempt)
        self.active = True

    def boundary(self, step: int, began: float = 0.0, forwards: int = 1) -> None:
        """A step ended (the optimizer post-hook), or none has yet: start, mark, or finish the
        capture. `began` is when the step ended now had its first training forward (wall),
        `forwards` how many it had (StepTracker.began, .micro)."""
        capture = self._running
        if capture is None:
            capture = self._pending
            if capture is None:
                self.active = False
            elif step >= capture.from_step:  # the ranks asked together start at the same step
                self._pending = None
                self._start(capture, step)
            return
        self._read_timings(capture)
        if capture.tail:
            self._finish(capture)  # one boundary past the last step: DDP has published its times
            return
        capture.ends.append((step - 1, time.time()))
        capture.firsts[step - 1] = (began, forwards)
        capture.taken += 1
        capture.profiler.step()
        over = time.monotonic() - capture.started > MAX_S
        if capture.taken >= capture.steps or over:
            if capture.taken < capture.steps:
                capture.stopped_early = f"stopped after {MAX_S:.0f} s, {capture.taken} of {capture.steps} steps in"
            self._stop_profiler(capture)

    def abort(self, why: str) -> None:
        """The rank is exiting: stop what runs, say so, and give a trace being written a moment."""
        capture, self._pending = self._running, None
        self.active = False
        if capture is not None:
            if capture.profiler is not None and not capture.tail:
                profiler = capture.profiler
                _quietly(lambda: profiler.__exit__(None, None, None))
            self._release()
            self._send(capture.record(error=f"{why} {capture.taken} of {capture.steps} steps into the capture"))
        if self._writing is not None:
            self._writing.join(EXPORT_WAIT_S)

    def _start(self, capture: Capture, step: int) -> None:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile, schedule

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                activities.append(ProfilerActivity.CUDA)
            # A schedule that records throughout: with one, the trace marks each step (ProfilerStep#N).
            # Its warning that a schedule with no warm-up step may skew the first step's times is
            # for the rank's log to carry on every capture: the summary reads DDP's times, not these.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                profiler = profile(activities=activities, schedule=schedule(wait=0, warmup=0, active=MAX_STEPS + 1, repeat=1))
            profiler.__enter__()
        except Exception as exc:  # noqa: BLE001 - the profiler refused (another one runs): said, and the job trains on
            self.active = False
            self._send(capture.record(error=f"the profiler would not start: {type(exc).__name__}: {exc}"))
            return
        capture.profiler, capture.first_step, capture.started = profiler, step, time.monotonic()
        capture.ends.append((step - 1, time.time()))
        self.hold_rate(1)
        self._running = capture

    def _stop_profiler(self, capture: Capture) -> None:
        try:
            capture.profiler.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - a profiler that fails to stop: the capture is lost, the job goes on
            self._release()
            self._send(capture.record(error=f"the profiler failed to stop: {type(exc).__name__}: {exc}"))
            return
        capture.tail = True

    def _release(self) -> None:
        """No capture runs any more: the steps read nothing, and DDP samples as it did before."""
        self._running, self.active = None, False
        self.hold_rate(None)

    def _finish(self, capture: Capture) -> None:
        self._release()
        profiler, capture.profiler = capture.profiler, None
        self._writing = threading.Thread(target=self._write, args=(capture, profiler), name="ddptop-profile", daemon=True)
        self._writing.start()

    def _write(self, capture: Capture, profiler: Any) -> None:
        """On a thread of its own: the trace, gzipped, and the summary."""
        try:
            fields: dict[str, Any] = {"phases": phases(capture), "ops": top_ops(profiler, capture.taken), "cuda": _has_cuda(profiler)}
            fields["path"] = write_trace(profiler, capture)
            if capture.stopped_early:
                fields["error"] = capture.stopped_early
        except Exception as exc:  # noqa: BLE001 - no room for the trace, an export that fails: said, the job trains on
            fields = {"error": f"the trace could not be written: {type(exc).__name__}: {exc}"}
        self._send(capture.record(**fields))

    def _read_timings(self, capture: Capture) -> None:
        for model in self.models():
            data = sampled.ddp_logging_data(model)
            iteration = data.get("iteration", 0)
            if iteration and data.get("forward_compute_time_start"):
                capture.timings[iteration] = data


def _quietly(call: Callable[[], Any]) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - cleanup of a capture must never reach the training thread
        return


def phases(capture: Capture) -> dict[str, float]:
    """Each phase's mean ms over the captured steps that DDP timed: data, accumulation (the
    micro-batches before the synced one, where any step had several), forward, backward,
    comm, overlap (of comm with the backward's compute), optimizer (the backward's end to
    the step's end: the optimizer, zero_grad), step."""
    spans = {step: (begin, end) for (step, end), (_, begin) in zip(capture.ends[1:], capture.ends)}
    taken: dict[str, list[float]] = {}
    accumulates = any(forwards > 1 for _, forwards in capture.firsts.values())
    for data in capture.timings.values():
        start = data["forward_compute_time_start"] * sampled.NS
        step = next((s for s, (begin, end) in spans.items() if begin <= start <= end), None)
        if step is None or step < capture.first_step:
            continue
        begin, end = spans[step]
        first, forwards = capture.firsts.get(step, (start, 1))
        first = min(max(first, begin), start) if forwards > 1 else start
        if accumulates:
            taken.setdefault("accumulation", []).append((start - first) * 1e3)
        backward_end = max(data.get("backward_compute_time_end", 0), data.get("backward_comm_time_end", 0)) * sampled.NS
        for name, value in (
            ("data", (first - begin) * 1e3),
            ("forward", data.get("forward_compute_time", 0) / 1e6),
            ("backward", data.get("backward_compute_time", 0) / 1e6),
            ("comm", data.get("backward_comm_time", 0) / 1e6),
            ("overlap", data.get("backward_compute_comm_overlap_time", 0) / 1e6),
            ("optimizer", max(0.0, end - backward_end) * 1e3 if backward_end else 0.0),
            ("step", (end - begin) * 1e3),
        ):
            taken.setdefault(name, []).append(value)
    return {name: round(statistics.mean(values), 3) for name, values in taken.items()}


def top_ops(profiler: Any, steps: int) -> list[list[Any]]:
    """The ops with the most self time, CPU's and CUDA's: [name, self CPU ms, self CUDA ms, calls], a step's mean."""
    per = max(steps, 1)
    rows = []
    for event in profiler.key_averages():
        if event.key.startswith("ProfilerStep"):  # the step's own span: its self time is what no op took
            continue
        cuda = getattr(event, "self_device_time_total", None)
        if cuda is None:
            cuda = getattr(event, "self_cuda_time_total", 0) or 0
        rows.append([event.key, event.self_cpu_time_total / 1e3 / per, cuda / 1e3 / per, event.count / per])
    by_cpu = sorted(rows, key=lambda row: -row[1])[:TOP_OPS]
    by_cuda = [row for row in sorted(rows, key=lambda row: -row[2])[:TOP_OPS] if row[2] > 0 and row not in by_cpu]
    return [[name, round(cpu, 4), round(gpu, 4), round(calls, 2)] for name, cpu, gpu, calls in by_cpu + by_cuda]


def _has_cuda(profiler: Any) -> bool:
    return any(getattr(event, "device_type", None) is not None and "CUDA" in str(event.device_type) for event in profiler.events())


def write_trace(profiler: Any, capture: Capture) -> str:
    """The trace as gzipped Chrome trace JSON in the run's profiles/, named by attempt, rank and first step."""
    os.makedirs(capture.folder, mode=0o700, exist_ok=True)
    name = f"attempt{capture.attempt}-rank{capture.rank}-step{capture.first_step}"
    raw = os.path.join(capture.folder, f".{name}.json")
    path = os.path.join(capture.folder, f"{name}.pt.trace.json.gz")
    try:
        profiler.export_chrome_trace(raw)
        with open(raw, "rb") as source, gzip.open(path, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target)
    finally:
        if os.path.exists(raw):
            os.unlink(raw)
    if os.path.getsize(path) > MAX_TRACE_BYTES:
        os.unlink(path)
        raise OSError(f"the trace came to over {MAX_TRACE_BYTES >> 20} MiB gzipped; capture fewer steps")
    return path
