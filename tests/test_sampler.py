"""The sampler's psutil path for real, its NVML path against a fake of pynvml's shape."""

import os
import subprocess
import sys

import psutil
import pytest
from fake_pynvml import FakeNvml
from support import counts_storage_bytes, wait_for

from ddptop.core import rundir
from ddptop.core.usage import UsageError
from ddptop.supervisor.launching.args import split
from ddptop.supervisor.launching.plan import plan_job, visible_gpus
from ddptop.supervisor.sampler import Sampler, gpu_count


def test_without_nvml_processes_are_still_sampled():
    sampler = Sampler(None)
    record = sampler.sample({0: os.getpid()})
    assert record["gpus"] == [] and not sampler.has_gpus
    (proc,) = record["procs"]
    assert proc["rss"] > 0 and "cpu" in proc and "gpu" not in proc


WRITER = """
import sys
sys.stdin.readline()
with open(sys.argv[1], "wb") as out:
    out.write(bytes(8 << 20))
print("written", flush=True)
sys.stdin.read()
"""


def test_a_process_writing_to_storage_reads_its_bytes_a_second_and_then_none(tmp_path):
    """What a checkpoint written to slow storage shows while the rank sleeps in the kernel: the
    pages it dirties. Its first reading has nothing to compare with; an idle one reads 0."""
    if not counts_storage_bytes(tmp_path):
        pytest.skip("this kernel does not count a process's storage bytes")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "ckpt")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        sampler = Sampler(None)
        (first,) = sampler.sample({0: writer.pid})["procs"]
        assert "io" not in first
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "written\n"
        (writing,) = sampler.sample({0: writer.pid})["procs"]
        (idle,) = sampler.sample({0: writer.pid})["procs"]
    finally:
        writer.communicate("")
    assert writing["io"] > 0 and idle["io"] == 0.0


def test_gpu_readings_and_per_process_memory():
    me = os.getpid()
    nvml = FakeNvml(gpus=2, processes={1: [(me, 3 * 2**30)]})
    record = Sampler(nvml).sample({5: me})
    _gpu0, gpu1 = record["gpus"]
    assert gpu1 == {
        "index": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "util": 51.0,
        "mem_used": 2 * 2**30,
        "mem_total": 80 * 2**30,
        "temperature": 41.0,
        "power_w": 250.0,
    }
    assert record["procs"][0]["gpu"] == 1 and record["procs"][0]["gpu_mem"] == 3 * 2**30


def test_in_a_container_a_rank_finds_its_gpu_memory_by_the_gpu_it_told():
    """NVML lists the host's pids, which a container's ranks do not have: a rank that told
    its GPU takes the one process there that is no other rank's; a shared GPU is not guessed."""
    me, other = os.getpid(), os.getppid()
    nvml = FakeNvml(gpus=2, processes={0: [(900001, 5 * 2**30)], 1: [(900002, 1 * 2**30), (900003, 2 * 2**30)]})
    gpu = "GPU-0000000{}-1111-2222-3333-444444444444"
    record = Sampler(nvml).sample({0: me, 1: other}, {0: gpu.format(0).upper(), 1: gpu.format(1)})
    by_rank = {p["rank"]: p for p in record["procs"]}
    assert (by_rank[0]["gpu"], by_rank[0]["gpu_mem"]) == (0, 5 * 2**30)
    assert "gpu_mem" not in by_rank[1], "two strangers on rank 1's GPU: which is it is not known"


def test_an_unsupported_field_reads_none_and_is_reported_once():
    warnings: list[str] = []
    sampler = Sampler(FakeNvml(gpus=2, no_power=True), warn=warnings.append)
    for _ in range(3):
        record = sampler.sample({})
    assert all(g["power_w"] is None for g in record["gpus"])
    assert len(warnings) == 1 and "power" in warnings[0]


def test_a_vanished_process_is_skipped():
    record = Sampler(None).sample({0: 2**22 + 12345})
    assert "rss" not in record["procs"][0]


@pytest.fixture
def run(tmp_path, ddptop_home):
    script = tmp_path / "t.py"
    script.write_text("")
    return rundir.create(script, None)


def test_gpus_are_bound_when_present(run):
    plan, notices = plan_job(split(["t.py", "--gpus", "2"]), FakeNvml(gpus=4), run, env={})
    assert plan.visible_gpus == [0, 1] and not plan.cpu_only
    assert notices == ["the script is one rank of a torchrun job: torchrun starts it once per rank on 2 GPUs"]
    assert gpu_count(FakeNvml(gpus=4)) == 4


def test_more_gpus_than_the_machine_has_is_refused(run):
    with pytest.raises(UsageError, match="more GPUs than this machine has \\(2\\)"):
        plan_job(split(["t.py", "--gpus", "3"]), FakeNvml(gpus=2), run, env={})


def test_no_gpu_means_cpu_ranks_on_gloo(run):
    plan, notices = plan_job(split(["t.py", "--gpus", "4"]), None, run, env={})
    assert plan.cpu_only and plan.nproc_per_node == 4
    assert notices == [
        "the script is one rank of a torchrun job: torchrun starts it once per rank",
        "no CUDA GPU found: starting 4 CPU ranks on gloo",
    ]


def test_the_gpus_cuda_visible_devices_leaves_are_what_a_launch_may_use(run):
    """A shared server's user keeps to their GPUs with CUDA_VISIBLE_DEVICES: --gpus is held to
    those, and hiding them all starts CPU ranks, said as such."""
    eight = FakeNvml(gpus=8)
    with pytest.raises(UsageError, match=r"--gpus 4 asks for more GPUs than CUDA_VISIBLE_DEVICES='2,3' leaves visible \(2\)"):
        plan_job(split(["t.py", "--gpus", "4"]), eight, run, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    plan, _ = plan_job(split(["t.py", "--gpus", "2"]), eight, run, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert plan.visible_gpus == [0, 1] and not plan.cpu_only  # indices into what the user made visible, which stays
    plan, notices = plan_job(split(["t.py", "--gpus", "2"]), eight, run, env={"CUDA_VISIBLE_DEVICES": ""})
    assert plan.cpu_only and notices[-1] == "CUDA_VISIBLE_DEVICES='' hides every GPU: starting 2 CPU ranks on gloo"


def test_cuda_visible_devices_is_read_as_cuda_reads_it():
    assert visible_gpus(8, {}) == 8
    assert visible_gpus(8, {"CUDA_VISIBLE_DEVICES": "0,1,9,2"}) == 2, "CUDA stops at the first index it cannot use"
    assert visible_gpus(8, {"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    assert visible_gpus(8, {"CUDA_VISIBLE_DEVICES": "GPU-8f2e, GPU-11aa"}) == 2
    assert visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c"}) == 2, "never more than the machine has"


def test_a_rank_that_exited_but_is_not_reaped_gives_no_reading():
    """psutil reads a zombie's RSS as 0: the dashboard showed "0 B" for ranks that had just ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    sampler = Sampler(None)
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 10, "the child to exit, unreaped")
    [entry] = sampler.sample({0: child.pid})["procs"]
    assert "rss" not in entry and "cpu" not in entry
    child.wait()
    [entry] = Sampler(None).sample({0: os.getpid()})["procs"]
    assert entry["rss"] > 0  # a live process still gives its reading


def test_a_process_whose_memory_is_released_gives_no_reading():
    """An exiting rank's memory goes before it is a zombie; kthreadd (pid 2) has none at all, as
    such a rank has then. Rank 0 of an ended job read "0 B" while rank 1 kept its last reading."""
    try:
        kernel_thread = psutil.Process(2)
        if kernel_thread.memory_info().rss != 0:
            pytest.skip("pid 2 here is not a kernel thread")
    except psutil.Error:
        pytest.skip("pid 2 is not visible in this process namespace")
    [entry] = Sampler(None).sample({0: 2})["procs"]
    assert entry == {"rank": 0, "pid": 2}
