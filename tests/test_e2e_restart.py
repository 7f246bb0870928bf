"""Restarts that lose nothing, and no process left behind, on real gloo jobs."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from support import DDPTOP, EXAMPLE, recorded, wait_for

from ddptop.core import rundir
from ddptop.trainer.template import MARK

pytestmark = pytest.mark.slow

STEPS, EVERY = 120, 10


def checkpoint_steps(low: int, high: int) -> list[int]:
    """Steps in [low, high) after which the example checkpoints."""
    return [s for s in range(low, high) if (s + 1) % EVERY == 0]


def run_example(tmp_path: Path, name: str, *extra: str) -> tuple[subprocess.CompletedProcess, rundir.RunDir]:
    run_path = tmp_path / f"run-{name}"
    proc = subprocess.run(
        [
            DDPTOP,
            "launch",
            "--headless",
            "--restart-backoff",
            "0",
            "--run-dir",
            str(run_path),
            str(EXAMPLE),
            "--gpus",
            "4",
            "--steps",
            str(STEPS),
            "--checkpoint-dir",
            str(tmp_path / f"ckpt-{name}"),
            "--checkpoint-every",
            str(EVERY),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    return proc, rundir.RunDir(run_path)


def final_sha(proc: subprocess.CompletedProcess) -> str:
    match = re.search(r"final-params-sha256 ([0-9a-f]{64})", proc.stdout)
    assert proc.returncode == 0 and match, proc.stderr[-3000:]
    return match.group(1)


def test_killed_three_times_ends_bitwise_equal_to_an_uninterrupted_run(ddptop_home, tmp_path):
    seed = int(os.environ.get("DDPTOP_TEST_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    kill1, rank1 = rng.randrange(12, 40), rng.randrange(4)
    torn = rng.choice(checkpoint_steps(kill1 + 1, 80))  # rank 0 dies inside this checkpoint
    kill3, rank3 = rng.randrange(torn + 1, STEPS - 5), rng.randrange(4)
    faults = [f"kill@{kill1}:{rank1}/0", f"ckpt-kill@{torn}:0/1", f"kill@{kill3}:{rank3}/2"]
    context = f"seed {seed} (DDPTOP_TEST_SEED), faults {faults}"

    reference, _ = run_example(tmp_path, "reference")
    broken, run = run_example(tmp_path, "broken", *(arg for fault in faults for arg in ("--inject", fault)))
    said = [line for line in broken.stdout.splitlines() + broken.stderr.splitlines() if line.startswith(("ddptop:", "[rank0]:resumed"))]
    context += "\n" + "\n".join(said)
    assert final_sha(broken) == final_sha(reference), context

    records = recorded(run)
    assert [r["restart"] for r in records if r["type"] == "group_restart"] == [1, 2, 3], context
    crashes = [r["text"] for r in records if r["type"] == "alert" and r["kind"] == "crash"]
    assert len(crashes) == 3 and all("killed by SIGKILL" in text for text in crashes), context + "\n" + "\n".join(crashes)
    resumed = [r["step"] for r in records if r["type"] == "resume" and r["rank"] == 0]
    assert len(resumed) == 3, context
    for step, killed in zip(resumed, (kill1, torn + 1, kill3), strict=True):
        assert (step + 1) % EVERY == 0 and killed - 2 * EVERY <= step < killed, (context, resumed)
    assert resumed[1] == torn - EVERY, f"the torn checkpoint of step {torn} was loaded: {context}"
    left = sorted(p.name for p in (tmp_path / "ckpt-broken").iterdir())
    assert len(left) == 3 and not any(name.endswith(".tmp") for name in left), left
    assert not any(r["type"] == "notice" and "plain way" in r["text"] for r in records), "the ranks were not forked from the template"
    for restart in (1, 2, 3):
        assert_phases_in_order(records, restart)


TICK_S = 0.02
"""A process's start time is read in the kernel's clock ticks."""


def assert_phases_in_order(records: list[dict], restart: int) -> None:
    """Where restart number `restart` went, mark by mark, as the event log has it:
    the failure noticed, the group restarted, the old ranks stopped, the
    rendezvous, then for each rank its process started, torch imported, its
    group joined, the checkpoint loaded, and its first step done."""
    agent = {r["phase"]: r["wall"] for r in records if r["type"] == "agent_phase" and r["restart"] == restart}
    noticed = min(r["wall"] for r in records if r["type"] == "worker_failure" and r["restart"] == restart - 1)
    restarted = next(r["wall"] for r in records if r["type"] == "group_restart" and r["restart"] == restart)
    marks = [noticed, restarted, agent["stopped"], agent["rendezvous"]]
    assert marks == sorted(marks), (restart, marks)
    attempt: dict[int, int] = {}
    ranks: dict[int, dict[str, float]] = {}
    for r in records:
        if r["type"] == "rank_hello":
            attempt[r["rank"]] = r["restart"]
            if r["restart"] == restart:
                ranks[r["rank"]] = {"started": r["started"]}
        elif attempt.get(r.get("rank")) == restart:
            mine = ranks[r["rank"]]
            if r["type"] == "phase":
                mine[r["phase"]] = r["wall"]
            elif r["type"] == "resume":
                mine["resumed"] = r["wall"]
            elif r["type"] == "step":
                mine.setdefault("first step", r["wall"])
    assert sorted(ranks) == [0, 1, 2, 3], (restart, ranks)
    for rank, mine in ranks.items():
        order = ["started", "torch", "group", "resumed", "first step"]
        assert set(mine) == set(order), (restart, rank, mine)
        walls = [agent["rendezvous"] - TICK_S, *(mine[name] for name in order)]
        assert walls == sorted(walls), (restart, rank, mine, agent)


def job_processes(supervisor: subprocess.Popen, ranks: int) -> list[psutil.Process]:
    """torchrun, the template and the ranks it forked, once all have started: the processes
    that must not outlive the job."""

    def found() -> list[psutil.Process] | None:
        try:
            torchrun = next(p for p in psutil.Process(supervisor.pid).children() if str(EXAMPLE) in " ".join(p.cmdline()))
            template = next(p for p in torchrun.children() if MARK in " ".join(p.cmdline()))
            forked = template.children()
        except (psutil.Error, StopIteration):
            return None
        return [torchrun, template, *forked] if len(forked) == ranks else None

    return wait_for(found, 90, f"torchrun, the template and {ranks} ranks forked from it")


def describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {proc.status()} ppid {proc.ppid()}: {' '.join(proc.cmdline())[:120]}"
    except psutil.Error as exc:
        return f"{proc.pid}: {exc}"


def ended(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


END_WAYS = {
    "job done": ("--steps", "400"),
    "Ctrl-C": ("--steps", "1000000"),
    "SIGTERM": ("--steps", "1000000"),
    "SIGKILL of the supervisor": ("--steps", "1000000"),
    "watchdog stop": ("--steps", "1000000", "--inject", "nan@150:1"),
}


@pytest.mark.parametrize("way", list(END_WAYS))
def test_no_process_outlives_the_job(ddptop_home, tmp_path, way):
    supervisor = subprocess.Popen(
        [
            DDPTOP,
            "launch",
            "--headless",
            "--on-nan",
            "stop",
            "--run-dir",
            str(tmp_path / "run"),
            str(EXAMPLE),
            "--gpus",
            "2",
            *END_WAYS[way],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    try:
        job = job_processes(supervisor, ranks=2)
        if way == "Ctrl-C":
            os.killpg(supervisor.pid, signal.SIGINT)  # what the terminal sends to the foreground group
        elif way == "SIGTERM":
            supervisor.terminate()
        elif way == "SIGKILL of the supervisor":
            supervisor.kill()
        supervisor.wait(timeout=120)
        ended_at = time.monotonic()
        wait_for(
            lambda: all(ended(p) for p in job),
            10,
            f"every job process to end after {way}; left: {[describe(p) for p in job if not ended(p)]}",
        )
        assert time.monotonic() - ended_at <= 10
        expected = {
            "job done": 0,
            "Ctrl-C": 128 + signal.SIGINT,
            "SIGTERM": 128 + signal.SIGTERM,
            "SIGKILL of the supervisor": -signal.SIGKILL,
            "watchdog stop": 1,
        }[way]
        assert supervisor.returncode == expected
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
