"""The CUDA paths on a real GPU: steady steps that never synchronise, late reads, the
flight recorder on NCCL, a NaN skipped on the device, a sharded step's collectives timed
on the device, NVML, a profile's CUDA kernels.

Skipped where torch sees no CUDA device (CI, a laptop): there the gloo tests
cover the same code's CPU half. Run on a GPU host with `python -m pytest -m
cuda` in an environment whose torch has CUDA.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist
from builders import steps_made
from hooked import installed
from norms import flat_of
from support import DDPTOP, EXAMPLE, SCRIPTS, run_ddptop, wait_for
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddptop.core import rundir
from ddptop.core.policy import GuardPolicy
from ddptop.supervisor.sampler import Sampler, load_nvml, release_nvml
from ddptop.supervisor.watching.rules import nan
from ddptop.trainer import flightrecorder, guard, hooks, late, patches, torchapi
from ddptop.trainer.collective_spans import DeviceComm
from ddptop.trainer.collective_timer import CollectiveTimer
from ddptop.trainer.sampled import Sampled
from ddptop.trainer.step_comm import COMM_WAIT
from ddptop.trainer.steps import StepTracker

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

os.environ.setdefault(flightrecorder.FR_ENV[0], flightrecorder.FR_ENTRIES)  # before any process group: the recorders read it once

SLEEP_CYCLES = 2_000_000_000
"""torch.cuda._sleep spins the GPU this many cycles: about a second, long enough that
the host is still far ahead of the device when it asks."""


@contextmanager
def any_sync_raises() -> Iterator[None]:
    """Inside, any wait of the host on the device raises: what a steady step must never do."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.fixture(autouse=True)
def torch_put_back():
    """Each test's hooks come off after it, whatever happened (patches.py)."""
    yield
    patches.undo()


@pytest.fixture(scope="module")
def nccl_world_of_one():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_a_late_value_is_not_ready_while_the_gpu_is_busy_and_exact_once_it_is():
    value = torch.full((), 3.5, device="cuda")
    late.scalar(value * 2).get()  # the ring's slots for this shape made, the kernels loaded: before the GPU is busy
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    loss = late.scalar(value * 2)
    assert isinstance(loss, late.RingRead)
    assert not loss.ready(), "reading the value would have waited for the GPU"
    torch.cuda.synchronize()
    assert loss.ready() and loss.get() == 7.0


def test_the_streams_looked_up_in_c_are_torchs_current_ones_one_object_each():
    side = torch.cuda.Stream()
    assert torchapi.current_stream(0) == torch.cuda.current_stream(0)
    assert torchapi.current_stream(0) is torchapi.current_stream(0), "one object a stream, not one a call"
    with torch.cuda.stream(side):
        assert torchapi.current_stream(0) == side


def test_a_late_value_made_on_a_side_stream_waits_for_that_stream():
    """The slot's event is recorded on the stream the copy is queued on: a value made under
    torch.cuda.stream(side) is not ready while side is busy, though the default stream is idle."""
    side = torch.cuda.Stream()
    value = torch.full((), 1.5, device="cuda")
    late.scalar(value * 2).get()  # the slots made, the kernels loaded
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        read = late.scalar(value * 4)
    assert torch.cuda.current_stream().query(), "the default stream has nothing queued"
    assert not read.ready(), "its copy waits behind side's sleep"
    torch.cuda.synchronize()
    assert read.ready() and read.get() == 6.0


class Job:
    """A DDP model on NCCL under ddptop's hooks, as in a rank; its records, read as the sender reads them."""

    def __init__(self, optimizer: str, scaler: bool = False, clips: bool = False, bucket_view: bool = False) -> None:
        self.records: list[dict[str, Any]] = []
        self.tracker = StepTracker(0, emit=self.records.append)
        self.sampled = Sampled(every=0.0)
        self.probe = hooks.install(self.tracker, GuardPolicy(), self.sampled)
        torch.manual_seed(0)
        module = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 16)).cuda()
        # Under gradient_as_bucket_view, in two buckets once DDP has rebuilt them (torch 2.13 on the CPU).
        buckets = {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.03} if bucket_view else {}
        self.model = DistributedDataParallel(module, device_ids=[0], **buckets)
        params = self.model.parameters()
        self.optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9) if optimizer == "sgd" else torch.optim.AdamW(params, fused=True)
        self.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12) if scaler else None
        self.clips = clips
        """Whether the script clips every gradient itself (at a norm no step reaches): its norm is then the guard's."""
        self.expected: list[torch.Tensor] = []
        """Each step's unscaled pre-clip norm as clip_grad_norm_ takes it, on the device, unread."""

    def step(self, nan_loss: bool = False) -> None:
        x = torch.randn(64, 256, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler is not None):
            loss = self.model(x).float().pow(2).mean()
        if nan_loss:
            loss = loss * math.nan
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            self.expected.append(torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters()]))
            if self.clips:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1e9)
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            scaled = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters()])
            self.expected.append(scaled / self.scaler._scale.clone())
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.tracker.build(self.sampled.read())

    def finish(self) -> list[dict[str, Any]]:
        return steps_made(self.tracker, self.records)


@pytest.mark.parametrize(
    ("optimizer", "scaler", "clips", "bucket_view"),
    [
        ("sgd", False, False, False),
        ("adamw-fused", False, False, False),
        ("adamw-fused", True, False, False),
        ("adamw-fused", False, True, False),
        ("adamw-fused", False, False, True),
        ("sgd", False, False, True),
    ],
)
def test_a_steady_instrumented_step_never_synchronises_and_reports_the_right_values(
    nccl_world_of_one, optimizer, scaler, clips, bucket_view
):
    """DDP times iterations 1-10 and every 100th, waiting for its own events at the next forward:
    steps 12 to 41 are what a steady step costs, and there any wait on the device raises."""
    job = Job(optimizer, scaler=scaler, clips=clips, bucket_view=bucket_view)
    for _ in range(12):
        job.step()
    torch.cuda.synchronize()
    with any_sync_raises():
        for _ in range(30):
            job.step()
    torch.cuda.synchronize()
    rows = job.finish()
    assert [r["step"] for r in rows] == list(range(42))
    normed = [(r["grad_norm"], float(n)) for r, n in zip(rows, job.expected) if r.get("skipped") != "scaler"]
    assert len(normed) >= 40, rows
    shown, expected = zip(*normed)
    assert shown == pytest.approx(expected, rel=1e-4), "the unscaled pre-clip norm clip_grad_norm_ gives"
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in rows)
    sampled = [r for r in rows if "comm_ms" in r]
    assert sampled and all(r["comm_ms"] > 0 and r["comm_bytes"] == (256 * 512 + 512 + 512 * 16 + 16) * 4 for r in sampled), sampled
    assert any(r.get("mem_alloc", 0) > 0 for r in rows)
    flat = flat_of(job.probe, job.optimizer)
    buckets = len({p.grad.untyped_storage().data_ptr() for p in job.model.parameters()})
    assert (flat is not None and len(flat.buffers) == buckets) is bucket_view, "gradients in DDP's buckets are normed by the buckets"


@pytest.mark.parametrize(
    ("clips", "bucket_view"),
    [(False, False), (True, False), (False, True)],
    ids=["its own norm", "the script's clip norm", "the buckets' norm"],
)
def test_a_nan_step_is_skipped_on_the_device_for_a_fused_optimizer_without_a_sync(nccl_world_of_one, clips, bucket_view):
    job = Job("adamw-fused", clips=clips, bucket_view=bucket_view)
    for _ in range(12):
        job.step()
    torch.cuda.synchronize()
    before = [p.detach().clone() for p in job.model.parameters()]
    with any_sync_raises():
        job.step(nan_loss=True)
        after = [p.detach().clone() for p in job.model.parameters()]
        for _ in range(5):
            job.step()
    rows = job.finish()
    assert all(torch.equal(b, a) for b, a in zip(before, after)), "the NaN step reached the weights"
    assert rows[12]["nonfinite"] and rows[12]["skipped"] == "nan" and rows[12]["local_nonfinite"]
    assert all(math.isfinite(r["loss"]) for r in rows[13:])


class Split(nn.Module):
    """A model split over two GPUs in one rank, which DDP takes with device_ids=None."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(64, 64).to("cuda:0"), nn.Linear(64, 8).to("cuda:1")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x).to("cuda:1"))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize(
    ("clip", "script_clips"), [(None, False), (1.0, False), (None, True)], ids=["found_inf alone", "and --clip-grad", "the script's clip"]
)
def test_a_model_split_over_two_gpus_steps_under_the_guard_with_clip_grad_norm_s_norm(nccl_world_of_one, clip, script_clips):
    """The guard's global norm and its clip take gradients on two devices as clip_grad_norm_ does;
    a fused AdamW is handed found_inf, which it moves to each device itself. A script's clip of
    the parameters last to first returns its norm on the second GPU, where the flag goes too."""
    records: list[dict[str, Any]] = []
    tracker = StepTracker(0, emit=records.append)
    hooks.install(tracker, GuardPolicy(clip_grad=clip), Sampled(every=0.0))
    torch.manual_seed(0)
    model = DistributedDataParallel(Split())
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    expected = []
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        (model(torch.randn(16, 64, device="cuda:0")).pow(2).mean() * 1e3).backward()
        expected.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
        if script_clips:
            torch.nn.utils.clip_grad_norm_(list(model.parameters())[::-1], 1e9)
        optimizer.step()
        tracker.build()
    rows = steps_made(tracker, records)
    assert [r["grad_norm"] for r in rows] == pytest.approx(expected, rel=1e-4)
    assert all(r.get("clipped") is (True if clip else None) for r in rows)


def test_an_sgd_nan_step_on_a_gpu_is_said_to_be_applied_once(nccl_world_of_one):
    job = Job("sgd")
    for _ in range(3):
        job.step()
    notes = [r for r in job.records if r["type"] == "rank_note"]
    job.finish()
    assert len(notes) == 1 and "--on-nan skip" in notes[0]["text"] and "SGD" in notes[0]["text"]


def test_a_checksum_on_the_gpu_copies_no_parameter_waits_for_nothing_and_equals_the_cpus():
    """The checksum sums each tensor's bits in their own width, wrapping around: the GPU's
    kernels must wrap as the CPU's do (4M random int32 words overflow), make no copy of a
    parameter, and not synchronise."""
    tensors = [
        torch.randn(4096, 1024, device="cuda"),
        torch.randn(4096, 1024, device="cuda").bfloat16(),
        torch.randn(999, device="cuda").half(),
    ]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with any_sync_raises():
        parts = guard.checksum_parts(tensors)
    assert len(parts) == 2 and torch.cuda.max_memory_allocated() - before < tensors[0].nbytes // 8
    assert guard.checksum(tensors) == guard.checksum([tensor.cpu() for tensor in tensors])


def test_the_nccl_flight_recorder_is_read_for_a_collective_completed_and_one_still_running(nccl_world_of_one):
    buffer = torch.ones(1024, device="cuda")
    dist.all_reduce(buffer)
    torch.cuda.synchronize()
    done = wait_for(lambda: (c := flightrecorder.collectives()) and c[0]["completed"] == c[0]["enqueued"] and c, 10, "a completed entry")
    [group] = done
    assert group["name"] == "default group" and group["op"] == "all_reduce" and group["bytes"] == 4096, group
    torch.cuda._sleep(SLEEP_CYCLES)
    dist.all_reduce(buffer)
    [running] = flightrecorder.collectives()
    assert running["enqueued"] == group["enqueued"] + 1 and running["completed"] == group["enqueued"], running
    torch.cuda.synchronize()
    wait_for(lambda: flightrecorder.collectives()[0]["completed"] == running["enqueued"], 10, "the running one completed")
    print(f"flight recorder: {group} then {running}")


def test_collectives_on_a_gpu_are_timed_on_their_stream_and_read_late_without_a_wait(nccl_world_of_one):
    """The timed step's collectives (trainer/collective_spans.py): bracketed by events on the
    stream current where they are called, read once those pass. The default stream is kept
    busy for about a second first: a span that began with the call, not where its stream
    reached it, would hold that second."""
    timer = CollectiveTimer()
    buffer, gathered = torch.ones(1024, device="cuda"), torch.empty(1024, device="cuda")
    timer.arm()
    dist.all_reduce(buffer)  # the events made and NCCL's kernels loaded: before the GPU is busy
    warm = timer.disarm()
    torch.cuda.synchronize()
    assert isinstance(warm, DeviceComm) and warm.get()
    torch.cuda._sleep(SLEEP_CYCLES)
    side = torch.cuda.Stream()
    with any_sync_raises():
        timer.arm()
        dist.all_reduce(buffer)
        dist.all_gather_into_tensor(gathered, buffer)
        with torch.cuda.stream(side):  # as FSDP's reduce-scatters run: the side stream is idle
            dist.all_reduce(torch.ones(8, device="cuda"))
        comm = timer.disarm()
        assert isinstance(comm, DeviceComm) and len(comm.spans) == 3
        assert not comm.ready() and comm.get() is None, "read before the device ran it"
    torch.cuda.synchronize()
    fields = comm.get()
    assert fields is not None and set(fields["comm_dims"]) == {"world"}, fields
    assert set(fields["comm_dims"]["world"]) == {"all-reduce", "all-gather"}, fields
    assert 0 < fields["comm_ms"] < 200, f"the second before them was counted: {fields}"
    assert 0 < fields[COMM_WAIT] <= fields["comm_ms"] + 1e-3, fields
    print(f"collectives timed on the GPU: {fields}")


def test_a_functional_collective_on_a_gpu_is_timed_from_its_launch_to_the_wait_for_it(nccl_world_of_one):
    """Tensor parallelism's (trainer/functional_timing.py): NCCL runs it on a stream of its
    own, and the current stream waits for it where its output is first used. Events before
    the launch and after that wait, on the current stream, read late with nothing
    synchronised, while that stream is busy for about a second first."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    mesh, timer, buffer = init_device_mesh("cuda", (1,)), CollectiveTimer(), torch.ones(1024, device="cuda")
    timer.arm()
    funcol.all_reduce(buffer, "sum", (mesh, 0)).wait()  # NCCL's kernels loaded, the events made
    warm = timer.disarm()
    torch.cuda.synchronize()
    assert isinstance(warm, DeviceComm) and warm.get()
    torch.cuda._sleep(SLEEP_CYCLES)
    with any_sync_raises():
        timer.arm()
        total = funcol.all_reduce(buffer, "sum", (mesh, 0)) + 1  # its first use waits for it
        comm = timer.disarm()
        assert isinstance(comm, DeviceComm) and [(span.group, span.op) for span in comm.spans] == [("world", "all-reduce")]
        assert not comm.ready() and comm.get() is None, "read before the device ran it"
    torch.cuda.synchronize()
    fields = comm.get()
    assert fields is not None and 0 < fields["comm_ms"] < 200, f"the second before it was counted: {fields}"
    assert torch.equal(total, torch.full_like(buffer, 2.0))
    print(f"a functional collective timed on the GPU: {fields}")


def test_an_fsdp2_step_on_a_gpu_carries_its_collectives_per_dimension(nccl_world_of_one):
    """A model FSDP2 shards on the GPU, under ddptop's hooks: the step after the first has its
    collectives timed on the device, in its own record once the GPU has run them."""
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).cuda()
    for layer in (model[0], model[2]):
        fsdp.fully_shard(layer)
    fsdp.fully_shard(model)
    with installed(GuardPolicy()) as records:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            loss = model(torch.randn(16, 64, device="cuda")).pow(2).mean()
            loss.backward()
            dist.all_reduce(loss.detach())
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        first, timed, untimed = records.steps()
    assert "comm_dims" not in first and "comm_dims" not in untimed, (first, untimed)
    assert "all-reduce" in timed["comm_dims"]["world"] and timed["comm_ms"] > 0, timed
    assert timed["comm_step"] == 1 and 0 <= timed["compute_ms"] <= timed["step_ms"], timed
    print(f"FSDP2's timed step on the GPU: {timed}")


def test_nvml_reads_this_gpu_and_this_process_memory():
    nvml = load_nvml()
    assert nvml is not None, "torch sees a GPU but NVML does not load"
    try:
        held = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        warnings: list[str] = []
        sampler = Sampler(nvml, warn=warnings.append)
        uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
        record = sampler.sample({0: os.getpid()}, {0: uuid})
        gpu = record["gpus"][torch.cuda.current_device()]
        assert "NVIDIA" in gpu["name"] and gpu["mem_total"] > gpu["mem_used"] >= held.numel()
        assert gpu["util"] is not None and 0 <= gpu["util"] <= 100
        assert gpu["temperature"] is not None and gpu["power_w"] is not None and gpu["power_w"] > 0
        proc = record["procs"][0]
        assert proc["gpu_mem"] >= held.numel() and proc["gpu"] == 0, proc
        print(f"NVML: {gpu}; this process: {proc}; warnings: {warnings}")
    finally:
        release_nvml(nvml)


def nccl_job(tmp_path, steps: int, *args: str) -> tuple[list[dict], list[dict], str]:
    run_path = tmp_path / "run"
    result = run_ddptop(
        "launch", "--headless", "--run-dir", str(run_path), "--desync-every", "50", str(EXAMPLE), "--gpus", "1", "--steps", str(steps), *args,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "on gloo" not in result.stderr
    records = list(rundir.read_events(rundir.RunDir(run_path)))
    rows = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in rows] == list(range(steps))
    return records, rows, result.stderr


@pytest.mark.slow
def test_an_nccl_job_reports_comm_memory_and_gpu_samples_and_an_sgd_nan_a_step_late(ddptop_home, tmp_path):
    records, rows, stderr = nccl_job(tmp_path, 3000, "--inject", "nan@2995:0")  # seconds of steps: samples see the rank
    sampled = [r for r in rows if "comm_ms" in r]
    assert sampled and all(r["comm_ms"] > 0 and r["comm_bytes"] > 0 and r["comm_step"] <= r["step"] for r in sampled)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows[:2995])
    memory = [r for r in rows if "mem_alloc" in r]
    assert memory and all(0 < r["mem_alloc"] <= r["mem_reserved"] and r["mem_peak"] >= r["mem_alloc"] for r in memory)
    assert [r["step"] for r in rows if "checksum" in r] == list(range(0, 3000, 50))
    samples = [r for r in records if r["type"] == "sample" and r["gpus"]]
    assert samples and all(g["mem_total"] > 0 for s in samples for g in s["gpus"])
    assert any(p.get("gpu_mem", 0) > 0 for s in samples for p in s["procs"]), "no sample read the rank's own GPU memory"
    assert rows[2995]["nonfinite"] is True and "skipped" not in rows[2995]
    assert nan.APPLIED_LATE in stderr and "takes no found_inf tensor" in stderr
    print(
        f"last finite step: {rows[2994]}\nlast sample with the rank's memory: {[s for s in samples if any(p.get('gpu_mem') for p in s['procs'])][-1]}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("how", [("--optimizer", "adamw-fused"), ("--on-nan", "skip")], ids=["fused, on the device", "--on-nan skip"])
def test_a_nan_step_is_skipped_on_cuda(ddptop_home, tmp_path, how):
    _, rows, stderr = nccl_job(tmp_path, 200, *how, "--inject", "nan@100:0")
    assert rows[100]["skipped"] == "nan" and rows[100]["nonfinite"] is True
    assert all(math.isfinite(r["loss"]) for r in rows[101:]), "a skipped NaN step must leave the weights finite"
    assert nan.ALERT.format(step=100, source=nan.ALONE, handling=nan.SKIPPED) in stderr


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


@pytest.mark.slow
def test_a_profile_of_a_gpu_rank_names_its_cuda_kernels(ddptop_home, tmp_path):
    run = rundir.RunDir(tmp_path / "run")
    job = subprocess.Popen(
        [DDPTOP, "launch", "--headless", "--run-dir", str(run.path), str(EXAMPLE), "--gpus", "1", "--steps", "10000000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: run.events_path.exists() and any(r["type"] == "step" and r["step"] >= 20 for r in rundir.read_events(run)), 120, "steps"
        )
        done = run_ddptop("profile", str(run.path), "--steps", "5", timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        [cuda] = [line for line in done.stdout.splitlines() if line.startswith("  top self CUDA: ")]
        [path] = [line.split("trace: ", 1)[1] for line in done.stdout.splitlines() if "trace: " in line]
        with gzip.open(path) as trace:
            kernels = [e for e in json.load(trace)["traceEvents"] if e.get("cat") == "kernel"]
        assert kernels, "the trace holds no CUDA kernel"
        print(done.stdout + f"\n{len(kernels)} kernel events in the trace")
        assert "ms" in cuda
    finally:
        run_ddptop("stop", str(run.path), timeout=120)
        job.wait(120)
