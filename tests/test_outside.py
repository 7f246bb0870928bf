"""The outside view: jobs ddptop did not launch, found from /proc, as `ddptop ps` lists them.

Real jobs on gloo, started as their users start them (plain torchrun, a script that calls
mp.spawn, tasks with SLURM's variables as srun starts them), never through ddptop.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support import DDPTOP, SCRIPTS, free_port, run_ddptop, wait_for

from ddptop.supervisor.outside.discovery import Job, discover

pytestmark = pytest.mark.slow


def stop(procs: list[subprocess.Popen]) -> None:
    """Each process and what it started: a torchrun's or a spawning script's children too."""
    for proc in procs:
        try:
            family = [proc.pid, *(child.pid for child in psutil.Process(proc.pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            family = []
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def jobs() -> Iterator[dict[str, subprocess.Popen | list[subprocess.Popen]]]:
    """Three jobs at once: torchrun with 2 ranks, mp.spawn with 2, and 2 srun-like tasks."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(SCRIPTS / "plain_ddp.py"), "--steps", "1000000"],
        **quiet,
    )  # fmt: skip
    spawn = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "spawn_tutorial.py"), "--steps", "1000000", "--step-s", "0.01", "--port", str(free_port())], **quiet
    )
    port = str(free_port())
    tasks = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "slurm_task.py")],
            env={
                **os.environ,
                "SLURM_JOB_ID": "4242",
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": str(task),
                "SLURM_LOCALID": str(task),
                "SLURM_NODEID": "0",
                "SLURM_NTASKS": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
            **quiet,
        )
        for task in (0, 1)
    ]
    yield {"torchrun": torchrun, "spawn": spawn, "srun": tasks}
    stop([torchrun, spawn, *tasks])


def ours(found: list[Job], launcher: str) -> list[Job]:
    """The jobs of one launcher that this module started (other tests' jobs may run beside them)."""
    return [job for job in found if job.launcher == launcher]


def test_each_job_is_found_with_its_launcher_and_its_ranks_in_order(jobs):
    torchrun, spawn = jobs["torchrun"], jobs["spawn"]
    tasks = jobs["srun"]
    assert isinstance(torchrun, subprocess.Popen) and isinstance(spawn, subprocess.Popen) and isinstance(tasks, list)

    def found() -> dict[str, Job] | None:
        seen = {job.id: job for job in discover().jobs}
        task_pids = {task.pid for task in tasks}
        srun = [job for job in seen.values() if {r.pid for r in job.ranks} == task_pids]
        if (
            len(seen.get(torchrun.pid, Job((), "", None, [])).ranks) == 2
            and len(seen.get(spawn.pid, Job((), "", None, [])).ranks) == 2
            and srun
        ):
            return {"torchrun": seen[torchrun.pid], "spawn": seen[spawn.pid], "srun": srun[0]}
        return None

    wait_for(found, 120, "every rank of the three jobs, found")
    by_launcher = found()
    assert by_launcher is not None
    job = by_launcher["torchrun"]
    assert (job.launcher, job.launcher_pid, job.world_size) == ("torchrun", torchrun.pid, 2)
    assert [(r.rank, r.local_rank, r.node) for r in job.ranks] == [(0, 0, 0), (1, 1, 0)]
    assert {r.pid for r in job.ranks} == {p.pid for p in psutil.Process(torchrun.pid).children()}
    assert "torch.distributed.run" in job.command and str(SCRIPTS / "plain_ddp.py") in job.command
    spawned = by_launcher["spawn"]
    assert (spawned.launcher, spawned.launcher_pid) == ("mp.spawn", spawn.pid)
    children = sorted(psutil.Process(spawn.pid).children(), key=lambda p: (p.create_time(), p.pid))
    assert [r.pid for r in spawned.ranks] == [c.pid for c in children if "resource_tracker" not in " ".join(c.cmdline())]
    assert [r.rank for r in spawned.ranks] == [0, 1]
    srun = by_launcher["srun"]
    assert (srun.launcher, srun.launcher_pid, srun.world_size) == ("srun", None, 2)
    assert [(r.rank, r.pid) for r in srun.ranks] == [(0, tasks[0].pid), (1, tasks[1].pid)]


def test_ps_lists_them_for_scripts_and_for_people(jobs):
    torchrun = jobs["torchrun"]
    assert isinstance(torchrun, subprocess.Popen)
    wait_for(lambda: any(job.id == torchrun.pid and len(job.ranks) == 2 for job in discover().jobs), 120, "the torchrun job's ranks")
    listed = run_ddptop("ps", "--json")
    assert listed.returncode == 0, listed.stderr
    [job] = [job for job in json.loads(listed.stdout) if job["id"] == torchrun.pid]
    assert job["launcher"] == "torchrun" and [r["rank"] for r in job["ranks"]] == [0, 1]
    assert all(r["status"] in ("running", "sleeping", "disk-sleep") and r["rss"] > 0 and r["threads"] >= 1 for r in job["ranks"])
    shown = subprocess.run([DDPTOP, "ps"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"job {torchrun.pid}: torchrun, 2 of 2 ranks: " in shown.stdout
    assert "step times, loss and grad norm are not seen from outside" in shown.stdout


def hung_job(mode: str, mark: Path) -> subprocess.Popen:
    """A 3-rank torchrun job, not ddptop's, whose rank 2 leaves the others waiting at step 20 (mode)."""
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(free_port()),
         str(SCRIPTS / "hang_at_collective.py"), "--mode", mode, "--mark", str(mark)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def verdicts_of(job_id: int) -> list[str]:
    listed = run_ddptop("ps", "--json")
    assert listed.returncode == 0, listed.stderr
    return next((job["verdicts"] for job in json.loads(listed.stdout) if job["id"] == job_id), [])


def test_the_odd_rank_out_is_named_with_where_it_is_and_where_the_others_wait(tmp_path):
    """Rank 2 sleeps in a function of its own while ranks 0 and 1 wait for it in all_reduce:
    named within 20 s of it going there, and `ddptop stacks PID` prints the two stacks, each once."""
    mark = tmp_path / "onset"
    job = hung_job("skip", mark)
    try:
        wait_for(mark.exists, 120, "rank 2 gone to its own branch")
        said = "rank 2 at hang_at_collective.py:46 in wait_for_checkpoint; ranks 0,1 in all_reduce at hang_at_collective.py:87 in main"
        wait_for(lambda: said in verdicts_of(job.pid), 20, "the odd rank out, named")
        stacks = run_ddptop("stacks", str(job.pid))
        assert stacks.returncode == 0, stacks.stderr
        text = stacks.stdout
        assert text.startswith(f"job {job.pid} (torchrun), ranks 0-2:"), text
        assert "\nranks 0-1:\n" in text and "\nrank 2:\n" in text and text.count("wait_for_checkpoint (") == 1, text
        assert text.index("ranks 0-1:") < text.index("rank 2:"), "the largest group first, the odd one apart"
    finally:
        stop([job])


def test_a_stopped_rank_is_named_within_20_s(tmp_path):
    mark = tmp_path / "onset"
    job = hung_job("sigstop", mark)
    try:
        wait_for(mark.exists, 120, "rank 2 about to stop itself")
        wait_for(
            lambda: any(v.startswith("rank 2 (pid ") and "is stopped (state T" in v for v in verdicts_of(job.pid)), 20, "the stop, named"
        )
    finally:
        stop([job])


def test_a_pid_that_is_no_rank_is_said_in_one_line():
    done = run_ddptop("stacks", str(os.getpid()))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "is no rank or launcher of a PyTorch distributed job on this host" in done.stderr
