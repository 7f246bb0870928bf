"""A stand-in for pynvml with its real function names, types and return shapes.

Only for what cannot exist on a machine without an NVIDIA driver: the
sampler's NVML path. Shapes follow nvidia-ml-py: structs with .gpu/.memory,
.total/.free/.used, process infos with .pid/.usedGpuMemory, power in mW.
"""

from __future__ import annotations

from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0
NVML_ERROR_NOT_SUPPORTED = 3


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NVML_ERROR_NOT_SUPPORTED: "Not Supported"}.get(self.value, "Unknown Error")


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class FakeNvml:
    """One instance per test; the module-level API is the instance's methods."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(self, gpus: int = 2, processes: dict[int, list[tuple[int, int]]] | None = None, no_power: bool = False):
        self.gpus = gpus
        self.processes = processes or {}
        self.no_power = no_power
        self.initialised = False

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        if not 0 <= index < self.gpus:
            raise NVMLError(2)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(self, handle) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle) -> str:
        return f"GPU-0000000{handle.index}-1111-2222-3333-444444444444"

    def nvmlDeviceGetUtilizationRates(self, handle) -> SimpleNamespace:
        return SimpleNamespace(gpu=50 + handle.index, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle) -> SimpleNamespace:
        total = 80 * 2**30
        used = (handle.index + 1) * 2**30
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return 40 + handle.index

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        if self.no_power:
            raise NVMLError_NotSupported()
        return 250_000

    def nvmlDeviceGetComputeRunningProcesses(self, handle) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.processes.get(handle.index, [])]
