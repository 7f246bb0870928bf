"""Where GPU and process readings are taken: NVML (nvidia-ml-py) and psutil.

The supervisor samples about once a second, off the event loop, and turns
the readings into one "sample" record. Both sources sit behind `Sampler`;
without an NVIDIA driver NVML is reported missing once and GPU fields stay
empty, everything else unchanged. Like nvitop, a field the driver does not
support reads as None (logged once per field), never as an error.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psutil

from ddptop.core.wire import records


def load_nvml() -> ModuleType | None:
    """pynvml, initialised, or None where there is no usable NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVML raises its own error types, and a driver may lack any call
        return None
    nvml: ModuleType = pynvml
    return nvml


def release_nvml(nvml: ModuleType | None) -> None:
    """Shut NVML down, e.g. before a fork: the child initialises its own."""
    if nvml is not None:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - NVML raises its own error types, and a driver may lack any call
            return


def gpu_count(nvml: ModuleType | None) -> int:
    if nvml is None:
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - NVML raises its own error types, and a driver may lack any call
        return 0


class NvmlReader:
    """Per-GPU util, memory, temperature, power; per-process GPU memory."""

    def __init__(self, nvml: ModuleType, warn: Callable[[str], None]) -> None:
        self._nvml = nvml
        self._warn = warn
        self._unsupported: set[str] = set()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpu_count(nvml))]
        self.uuids = {_uuid(self._read("uuid", nvml.nvmlDeviceGetUUID, handle)): index for index, handle in enumerate(self._handles)}
        """GPU index by UUID, as a rank tells its GPU (records.Heartbeat gpu_uuid)."""

    def _read(self, field: str, call: Callable[..., Any], *args: Any) -> Any:
        """call(*args), or None once NVML has said this driver cannot read field."""
        if field in self._unsupported:
            return None
        try:
            return call(*args)
        except self._nvml.NVMLError as exc:
            self._unsupported.add(field)
            self._warn(f"NVML cannot read {field} ({exc}); shown as N/A")
            return None

    def gpus(self) -> list[records.SampleGpu]:
        nvml, out = self._nvml, list[records.SampleGpu]()
        for index, handle in enumerate(self._handles):
            name = self._read("name", nvml.nvmlDeviceGetName, handle)
            util = self._read("utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
            mem = self._read("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
            temp = self._read("temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            power = self._read("power", nvml.nvmlDeviceGetPowerUsage, handle)
            out.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else (name or ""),
                    "util": None if util is None else float(util.gpu),
                    "mem_used": None if mem is None else int(mem.used),
                    "mem_total": None if mem is None else int(mem.total),
                    "temperature": None if temp is None else float(temp),
                    "power_w": None if power is None else power / 1000.0,
                }
            )
        return out

    def process_memory(self) -> dict[int, list[tuple[int, int | None]]]:
        """GPU index -> (pid, bytes used) of every compute process NVML sees on it."""
        found: dict[int, list[tuple[int, int | None]]] = {}
        for index, handle in enumerate(self._handles):
            procs = self._read("processes", self._nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            found[index] = [(int(proc.pid), proc.usedGpuMemory) for proc in procs]
        return found


def _uuid(value: Any) -> str:
    """NVML's "GPU-xxxxxxxx-..." (bytes from older bindings), as ranks write it."""
    return (value.decode() if isinstance(value, bytes) else str(value or "")).lower()


def rank_gpu_memory(
    on_gpus: dict[int, list[tuple[int, int | None]]], rank_pids: dict[int, int], rank_gpus: dict[int, int]
) -> dict[int, tuple[int, int | None]]:
    """rank -> (GPU index, bytes used) of its process as NVML lists it.

    By pid first. In a container NVML lists the host's pids, which match none of
    the ranks': then a rank that told its GPU (rank_gpus: rank -> index) takes the
    one process on that GPU that is no other rank's, when it is the only such rank
    there; where two ranks share a GPU, or strangers use it, nothing is guessed.
    """
    found: dict[int, tuple[int, int | None]] = {}
    by_pid = {pid: rank for rank, pid in rank_pids.items()}
    strangers: dict[int, list[int | None]] = {}
    for index, procs in on_gpus.items():
        for pid, used in procs:
            if pid in by_pid:
                found[by_pid[pid]] = (index, used)
            else:
                strangers.setdefault(index, []).append(used)
    unmatched: dict[int, list[int]] = {}
    for rank, index in rank_gpus.items():
        if rank not in found and rank in rank_pids:
            unmatched.setdefault(index, []).append(rank)
    for index, ranks in unmatched.items():
        if len(ranks) == 1 and len(strangers.get(index, [])) == 1:
            found[ranks[0]] = (index, strangers[index][0])
    return found


class Sampler:
    def __init__(self, nvml: ModuleType | None, warn: Callable[[str], None] = lambda m: print(f"ddptop: {m}", file=sys.stderr)) -> None:
        self._reader = NvmlReader(nvml, warn) if nvml is not None else None
        self._procs: dict[int, psutil.Process] = {}
        self._io: dict[int, tuple[float, int]] = {}
        """pid -> when its storage bytes were last read, and how many (storage_rate)."""

    @property
    def has_gpus(self) -> bool:
        return self._reader is not None

    def sample(self, rank_pids: dict[int, int], rank_gpus: dict[int, str] | None = None) -> records.Sample:
        """One reading of every rank process and GPU, as a "sample" record; rank_gpus: the GPU
        UUID each rank told, to find its memory where NVML's pids are not the ranks'."""
        gpu_procs: dict[int, tuple[int, int | None]] = {}
        if self._reader is not None:
            uuids = self._reader.uuids
            indices = {rank: uuids[_uuid(uuid)] for rank, uuid in (rank_gpus or {}).items() if _uuid(uuid) in uuids}
            gpu_procs = rank_gpu_memory(self._reader.process_memory(), rank_pids, indices)
        procs = []
        for rank, pid in rank_pids.items():
            entry: records.SampleProc = {"rank": rank, "pid": pid}
            proc = self._process(pid)
            if proc is not None:
                try:
                    with proc.oneshot():
                        # A rank that is exiting reads as 0 bytes and 0% from the moment the kernel
                        # releases its memory, before it is a zombie and after: no reading, so its
                        # last one stays. No live Python process has no resident memory.
                        rss = proc.memory_info().rss
                        if rss and proc.status() != psutil.STATUS_ZOMBIE:
                            entry["cpu"] = proc.cpu_percent()
                            entry["rss"] = rss
                            entry["threads"] = proc.num_threads()
                            if (io := self._storage_rate(proc)) is not None:
                                entry["io"] = io
                except psutil.Error:
                    self._procs.pop(pid, None)
                    self._io.pop(pid, None)
            if rank in gpu_procs:
                entry["gpu"], entry["gpu_mem"] = gpu_procs[rank]
            procs.append(entry)
        gpus = self._reader.gpus() if self._reader else []
        return {"type": "sample", "wall": time.time(), "procs": procs, "gpus": gpus}

    def _storage_rate(self, proc: psutil.Process) -> float | None:
        """Bytes a second proc moved to and from storage since its last reading; None at the first,
        or where the system does not count them (no io_counters, no task I/O accounting)."""
        try:
            counters = proc.io_counters()
        except (AttributeError, NotImplementedError, psutil.AccessDenied):
            return None
        now, moved = time.monotonic(), counters.read_bytes + counters.write_bytes
        last = self._io.get(proc.pid)
        self._io[proc.pid] = (now, moved)
        if last is None or now <= last[0]:
            return None
        rate: float = max(0, moved - last[1]) / (now - last[0])
        return rate

    def _process(self, pid: int) -> psutil.Process | None:
        """The same Process object across samples, as cpu_percent needs."""
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = self._procs[pid] = psutil.Process(pid)
                proc.cpu_percent()
            except psutil.Error:
                return None
        return proc
