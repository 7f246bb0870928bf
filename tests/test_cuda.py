"""The CUDA paths on a real GPU: NCCL comm timing by events, late reads, NVML.

Skipped where torch sees no CUDA device (CI, a laptop): there the fakes in
test_sampler.py and the gloo end-to-end tests cover the same code paths'
CPU halves. Run on a GPU host with `python -m pytest -m cuda` in an
environment whose torch has CUDA.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLE, SCRIPTS, run_ddptop

from ddptop.core import rundir
from ddptop.supervisor.sampler import Sampler, load_nvml, release_nvml
from ddptop.trainer import guard, late
from ddptop.trainer.commtimer import CommTimer, CudaSpans

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SLEEP_CYCLES = 200_000_000
"""torch.cuda._sleep spins the GPU this many cycles: ~0.1 s, long enough that
the host is still far ahead of the device when it asks."""


@pytest.fixture(scope="module")
def nccl_world_of_one():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield dist.group.WORLD
    dist.destroy_process_group()


def busy_gpu() -> None:
    """Queue ~0.1 s of GPU work, after warming the pinned-memory cache: its
    first allocation synchronises, the steady state's reuse does not. The
    warm value is read, as a step's values are, so its pinned buffer goes
    back to late.py's pool for the next late value instead of being freed."""
    warm = late.scalar(torch.ones((), device="cuda"))
    torch.cuda.synchronize()
    assert warm.ready()
    warm.get()
    torch.cuda._sleep(SLEEP_CYCLES)


@pytest.mark.xfail(
    strict=False,
    reason="seen failing on an H100 (torch 2.11, 2026-11-22) before the kernels were warmed "
    "up: the late value read as ready at once behind a torch.cuda._sleep. Likely CUDA's lazy module loading "
    "at a kernel's first use; not yet re-run on a GPU with the warm-up",
)
def test_a_late_value_is_not_ready_while_the_gpu_is_busy_and_exact_once_it_is():
    value = torch.full((), 3.5, device="cuda")
    late.scalar(value * 2).get()  # every kernel used below, loaded before the GPU is busy
    busy_gpu()
    loss = late.scalar(value * 2)
    assert isinstance(loss, late.LateTensor)
    assert not loss.ready(), "reading the value would have waited for the GPU"
    torch.cuda.synchronize()
    assert loss.ready() and loss.get() == 7.0


@pytest.mark.xfail(
    strict=False,
    reason="seen failing on an H100 (torch 2.11, 2026-11-22) before the kernels were warmed "
    "up: the late value read as ready at once behind a torch.cuda._sleep. Likely CUDA's lazy module loading "
    "at a kernel's first use; not yet re-run on a GPU with the warm-up",
)
def test_the_guard_decides_a_step_late_without_waiting_and_agrees_with_the_cpu():
    torch.manual_seed(0)
    grads = [torch.randn(1000, device="cuda") * 100, torch.randn(10, 10, device="cuda")]
    on_cpu = [g.cpu() for g in grads]
    expected = guard.verdict_late(guard.Gradients.of(on_cpu), [], clip_grad=1.0)
    for value in guard.verdict_late(
        guard.Gradients.of([g.clone() for g in grads]), [torch.ones((), device="cuda")], clip_grad=1.0
    ).values():
        value.get()  # every kernel used below, loaded before the GPU is busy
    busy_gpu()
    values = guard.verdict_late(guard.Gradients.of(grads), [torch.ones((), device="cuda")], clip_grad=1.0)
    assert sorted(values) == ["clipped", "grad_norm", "local_nonfinite", "nonfinite"]
    assert not any(v.ready() for v in values.values()), "the guard waited for the GPU"
    torch.cuda.synchronize()
    read = {k: v.get() for k, v in values.items() if v.get() is not None}
    assert read == {"grad_norm": pytest.approx(expected["grad_norm"], rel=1e-5), "clipped": True}
    assert all(torch.allclose(g.cpu(), c, rtol=1e-5) for g, c in zip(grads, on_cpu))


def test_comm_spans_are_cuda_events_measured_without_waiting(nccl_world_of_one):
    timer = CommTimer()
    buffer = torch.ones(1 << 20, device="cuda")
    torch.cuda._sleep(SLEEP_CYCLES)
    span = timer.begin()
    dist.all_reduce(buffer, group=nccl_world_of_one)
    timer.end(span, buffer)
    taken = timer.take()
    assert taken is not None
    spans, nbytes = taken
    assert isinstance(spans, CudaSpans) and nbytes == buffer.numel() * 4
    assert not spans.ready()
    torch.cuda.synchronize()
    assert spans.ready() and 0.0 < spans.get() < 100.0


def test_guard_on_cuda_agrees_with_torch_and_with_the_cpu():
    torch.manual_seed(0)
    grads = [torch.randn(1000, device="cuda"), torch.randn(10, 10, device="cuda")]
    expected = float(torch.nn.utils.get_total_norm([g.clone() for g in grads]))
    assert guard.norms_now(grads, grads) == pytest.approx((expected, expected), rel=1e-6)

    params = [torch.randn(300, device="cuda"), torch.randn(7, 9, device="cuda", dtype=torch.float16)]
    on_gpu = guard.checksum(params)
    assert late.is_late(on_gpu)
    torch.cuda.synchronize()
    assert on_gpu.ready() and on_gpu.get() == guard.checksum([p.cpu() for p in params])

    sums = guard.LocalCheck()
    sums.add(grads[0])
    poisoned = grads[1].clone()
    poisoned[3, 3] = float("nan")
    sums.add(poisoned)
    assert guard.any_nonfinite(sums.take()) is True


def test_nvml_reads_this_gpu_and_this_process_memory():
    nvml = load_nvml()
    assert nvml is not None, "torch sees a GPU but NVML does not load"
    try:
        held = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        warnings: list[str] = []
        sampler = Sampler(nvml, warn=warnings.append)
        record = sampler.sample({0: os.getpid()})
        gpu = record["gpus"][torch.cuda.current_device()]
        assert "NVIDIA" in gpu["name"] and gpu["mem_total"] > gpu["mem_used"] >= held.numel()
        assert gpu["util"] is not None and 0 <= gpu["util"] <= 100
        assert gpu["temperature"] is not None and gpu["power_w"] is not None and gpu["power_w"] > 0
        proc = record["procs"][0]
        assert proc.get("gpu_mem") is None or proc["gpu_mem"] >= held.numel(), proc
        print(f"NVML: {gpu}; this process: {proc}; warnings: {warnings}")
    finally:
        release_nvml(nvml)


def nccl_job(tmp_path, *args: str) -> tuple[list[dict], list[dict], str]:
    run_path = tmp_path / "run"
    result = run_ddptop(
        "launch",
        "--headless",
        "--run-dir",
        str(run_path),
        "--desync-every",
        "50",
        str(EXAMPLE),
        "--gpus",
        "1",
        "--steps",
        "200",
        *args,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "on gloo" not in result.stderr
    records = list(rundir.read_events(rundir.RunDir(run_path)))
    rows = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in rows] == list(range(200))
    return records, rows, result.stderr


@pytest.mark.slow
def test_an_nccl_job_reports_comm_memory_and_gpu_samples_and_a_nan_a_step_late(ddptop_home, tmp_path):
    records, rows, stderr = nccl_job(tmp_path, "--inject", "nan@195:0")
    assert all(r["comm_ms"] > 0 and r["comm_bytes"] > 0 for r in rows), [r["step"] for r in rows if "comm_ms" not in r]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows[:195])
    assert all(0 < r["mem_alloc"] <= r["mem_reserved"] and r["mem_peak"] >= r["mem_alloc"] for r in rows)
    assert [r["step"] for r in rows if "checksum" in r] == [0, 50, 100, 150]
    samples = [r for r in records if r["type"] == "sample" and r["gpus"]]
    assert samples and all(g["mem_total"] > 0 for s in samples for g in s["gpus"])
    assert rows[195]["nonfinite"] is True and "skipped" not in rows[195]
    assert "non-finite loss or gradients at step 195" in stderr and "--on-nan skip" in stderr
    print(f"last finite step: {rows[194]}\nlast sample: {samples[-1]}")


@pytest.mark.slow
def test_on_nan_skip_skips_the_step_on_cuda_too(ddptop_home, tmp_path):
    _, rows, stderr = nccl_job(tmp_path, "--on-nan", "skip", "--inject", "nan@100:0")
    assert rows[100]["skipped"] == "nan" and rows[100]["nonfinite"] is True
    assert all(math.isfinite(r["loss"]) for r in rows[101:]), "a skipped NaN step must leave the weights finite"
    assert "step skipped on all ranks" in stderr


@pytest.mark.slow
def test_the_flight_recorder_is_on_and_a_rank_that_sits_still_reports_its_nccl_collectives(ddptop_home, tmp_path):
    result = run_ddptop(
        "launch", "--headless", "--run-dir", str(tmp_path / "run"), str(SCRIPTS / "nccl_waits.py"), "--gpus", "1", timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "flight recorder buffer 2000" in result.stdout
    told = [r["collectives"] for r in rundir.read_events(rundir.RunDir(tmp_path / "run")) if r.get("collectives")]
    assert told, "no heartbeat carried the flight recorder's sequence numbers"
    [group] = told[-1]
    assert group["name"] == "default group" and group["op"] == "all_reduce", told
    assert group["enqueued"] >= 10 and group["completed"] == group["enqueued"], told  # ten steps' all-reduces, all done
    print(f"flight recorder status from the heartbeats: {told}")


def test_the_zero_code_loss_never_synchronises(monkeypatch):
    """Two micro-steps' losses, one scaled by a GradScaler, summed and sent on: under the
    sync debug mode "error", any read of a CUDA value on the host would raise."""
    import weakref

    from ddptop.trainer import hooks
    from ddptop.trainer.policy import GuardPolicy
    from ddptop.trainer.steps import StepTracker

    monkeypatch.setattr(torch.amp.GradScaler, "scale", torch.amp.GradScaler.scale)
    records: list = []
    probe = hooks.Probe(StepTracker(0, emit=records.append), GuardPolicy())
    hooks._wrap_grad_scaler(probe)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    first, second = (x @ x).pow(2).mean(), (x * 3).pow(2).mean()
    warm = late.scalar(first.detach())  # the pinned buffer's first allocation may wait: not the step's
    warm.get()
    scaled = scaler.scale(second)
    assert probe.scaled[id(scaled)][0]() is scaled and isinstance(weakref.ref(scaled), weakref.ref)
    probe.tracker.forward_begin(None)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for loss in (first, scaled):
            probe.tracker.losses += hooks._loss_values(probe, loss)
        value = late.losses(probe.tracker.losses)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert value.get() == pytest.approx(first.item() + second.item(), rel=1e-6)
