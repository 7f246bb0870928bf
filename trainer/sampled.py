"""What a rank reads about once a second: DDP's own comm timings and GPU memory.

Comm time comes from DDP's reducer, which times sampled iterations in C++;
the sender's thread marks a read due and the training thread makes it after
its next optimizer step, where the reducer's lock is free, and sets DDP's
sample rate from the job's pace (docs/design.md, "comm time and memory").
A sharded job has no reducer: there the same read times the collectives of
the step that follows it (collective_timer.py), and that step's record
carries them. Nothing here imports torch at module level: models are handed
in by hooks.py.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from ddptop.trainer.collective_spans import DeviceComm
from ddptop.trainer.collective_timer import CollectiveTimer

READ_EVERY_S = 1.0

COMM_TIMED = "comm_timed"
"""The key of a timed step's comm read late (collective_spans.DeviceComm), which reads as fields."""

NS = 1e-9

DDP_SAMPLE_RATE = 100
"""DDP's own runtime logging sample rate (kDDPRuntimeLoggingSampleRate): a new model's."""
RATES = (1, 2, 5, 10, 20, 50, DDP_SAMPLE_RATE)
"""The sample rates a model is set to: round ones, so that a pace that wavers does not set a new
rate at every reading (a new rate moves the next sampled iteration)."""


def rate_for(iterations_per_s: float, every: float = READ_EVERY_S) -> int:
    """The smallest rate of RATES that samples at most once in `every` seconds at this pace (so a
    sample comes every 1 to 2.5 reads), or DDP's own for a faster one."""
    per_read = iterations_per_s * every
    return min((rate for rate in RATES if rate >= per_read), default=DDP_SAMPLE_RATE)


class Sampled:
    def __init__(self, clock: Callable[[], float] = time.monotonic, every: float = READ_EVERY_S) -> None:
        self._models: list[weakref.ref[Any]] = []
        """The DDP models, weakly; appended by the training thread, copied by the reader."""
        self._seen: dict[int, int] = {}
        """Per model (by id), the DDP iteration read last."""
        self.rate = DDP_SAMPLE_RATE
        """The sample rate the job's pace chose."""
        self._paced: tuple[int, float, int] | None = None
        """The step and the time of the last read_comm, and the rate the pace up to it asked."""
        self._held: int | None = None
        """The rate a profiler capture holds every model at (profiling.py), or None."""
        self.device: int | None = None
        """The CUDA device whose allocator is read: the first CUDA DDP model's."""
        self._uuid: str | None = None
        self._clock = clock
        self._every = every
        self._next = 0.0
        self.comm_due = False
        """Set by the sender's thread once a second; the training thread reads DDP's timings (read_comm)."""
        self._comm: dict[str, Any] = {}
        """What read_comm found, until the sender's next read takes it."""
        self.collectives = CollectiveTimer()
        """Times a sharded job's collectives, one step in every `every` seconds (time_sharded)."""
        self._sharded = False
        self._next_timed = 0.0

    def add_model(self, model: Any) -> None:
        """A DDP model, on the training thread (hooks.py)."""
        self._models.append(weakref.ref(model))
        if (rate := self._held or self.rate) != DDP_SAMPLE_RATE:
            set_rate(model, rate)
        if self.device is None:
            param = next(iter(model.module.parameters()), None)
            if param is not None and param.is_cuda:
                self.device = param.device.index

    def read(self, now: bool = False) -> dict[str, Any]:
        """What is new since the last read, at most once every `every` seconds (or now: at the
        rank's exit, so that a job shorter than that has its figures too): the sampled comm
        figures (comm_ms, comm_overlap_ms, comm_bytes, comm_wall: the sampled iteration's forward,
        in Unix seconds) and the allocator's memory. {} between reads."""
        if not now and self._clock() < self._next:
            if not self._seen:  # no reading yet: ask at every read until DDP's first one is found (see above)
                self.comm_due = True
            return {}
        self._next = self._clock() + self._every
        if now:  # on the training thread, at its exit: the reducer is idle
            self.read_comm()
        values = memory(self.device) if self.device is not None else {}
        comm, self._comm = self._comm, {}
        values.update(comm)
        self.comm_due = True
        return values

    def time_sharded(self) -> None:
        """The job's gradients are sharded over its ranks: from the step that ends next, one
        step's collectives are timed every `every` seconds."""
        self._sharded = self.comm_due = True

    def read_comm(self, step: int | None = None) -> dict[str, Any] | None:
        """DDP's latest sampled timings, on the training thread after step `step` (see above),
        and the job's pace since the last read; None at the rank's exit: no pace. Of a
        sharded job, the step that ends now, if it was timed: its comm fields (StepComm.values),
        or on a GPU, where they are read late, a Late that reads as them."""
        self.comm_due = False
        if self.collectives.armed:
            timed = self.collectives.disarm()
            if step is None:
                return None
            return {COMM_TIMED: timed} if isinstance(timed, DeviceComm) else timed.values()
        found = self._read_models()
        if found:
            self._comm = found
        if step is None:
            return None
        now = self._clock()
        if self._sharded and now >= self._next_timed:
            self._next_timed = now + self._every
            self.collectives.arm()
            self.comm_due = True  # the next step's end disarms
        asked = DDP_SAMPLE_RATE
        if self._paced is not None and step > self._paced[0] and now > self._paced[1]:
            asked = rate_for((step - self._paced[0]) / (now - self._paced[1]), self._every)
            # The faster of the last two paces: one long gap between steps (an evaluation, a
            # checkpoint) would otherwise have a fast job sampled at every step for a second.
            rate = max(asked, self._paced[2])
            if rate != self.rate:
                self.rate = rate
                if self._held is None:
                    self._set_rates(rate)
        self._paced = (step, now, asked)
        return None

    def hold_rate(self, rate: int | None) -> None:
        """Every model sampled at `rate` (a capture times each of its steps), or, with None, at the
        rate its pace chose again; on the training thread."""
        self._held = rate
        self._set_rates(rate or self.rate)

    def _set_rates(self, rate: int) -> None:
        for ref in list(self._models):
            if (model := ref()) is not None:
                set_rate(model, rate)

    def gpu_uuid(self) -> str | None:
        """The UUID of the rank's GPU as NVML writes it ("GPU-..."), once it has one; on the sender's thread."""
        if self._uuid is None and self.device is not None:
            torch = sys.modules["torch"]
            self._uuid = f"GPU-{torch.cuda.get_device_properties(self.device).uuid}"
        return self._uuid

    def _read_models(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for ref in list(self._models):
            model = ref()
            if model is None:
                continue
            data = ddp_logging_data(model)
            iteration = data.get("iteration", 0)
            if not iteration or self._seen.get(id(model)) == iteration or not data.get("backward_comm_time"):
                continue
            self._seen[id(model)] = iteration
            figures = comm_figures(data)
            if found:  # two DDP models stepped in this second: their all-reduces add up
                for key in ("comm_ms", "comm_overlap_ms", "comm_bytes", "compute_ms"):
                    figures[key] += found[key]
            found = figures
        return found


def set_rate(model: Any, rate: int) -> None:
    """DDP's runtime logging sample rate of a model; a torch without it, or a model gone, is left be."""
    try:
        model._set_ddp_runtime_logging_sample_rate(rate)
    except Exception:  # noqa: BLE001 - a private torch API: never let it reach the training thread
        return


def ddp_logging_data(model: Any) -> dict[str, Any]:
    """DDP's logging data for a model ({} when it has none: a model not yet run, an older torch)."""
    try:
        data: dict[str, Any] = model._get_ddp_logging_data()
    except (AttributeError, RuntimeError, AssertionError):
        return {}
    return data


def comm_figures(data: dict[str, Any]) -> dict[str, Any]:
    """One sampled iteration's comm figures, from DDP's logging data."""
    sizes = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
    return {
        "comm_ms": data["backward_comm_time"] / 1e6,
        "comm_overlap_ms": data.get("backward_compute_comm_overlap_time", 0) / 1e6,
        "compute_ms": (data.get("forward_compute_time", 0) + data.get("backward_compute_time", 0)) / 1e6,
        "comm_bytes": sum(int(size) for size in sizes.split(",") if size.strip()),
        "comm_wall": data.get("forward_compute_time_start", 0) * NS,
    }


def memory(device: int) -> dict[str, int]:
    """The allocator's allocated, reserved and peak bytes on device; {} before CUDA is used."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    if not stats:
        return {}
    allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
    return {"mem_alloc": allocated["current"], "mem_reserved": reserved["current"], "mem_peak": allocated["peak"]}
