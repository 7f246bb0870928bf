"""A job operated from the shell as a user would: `ddptop kill`, `restart`, `logs -f` and `stop`
on a real gloo job, then `ddptop ls` telling how it ended and where its time went; and the
outcome of a run that crashed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import psutil
import pytest
from support import DDPTOP, EXAMPLE, SCRIPTS, free_port, run_ddptop, wait_for

from ddptop.core import rundir

pytestmark = pytest.mark.slow


def attempt_steps(run: rundir.RunDir, attempt: int) -> int:
    """Steps finished by rank 0 in the attempt (its records follow its hello)."""
    current, steps = None, 0
    for r in rundir.read_events(run) if run.events_path.exists() else ():
        if r["type"] == "rank_hello" and r["rank"] == 0:
            current = r["restart"]
        elif r["type"] == "step" and r["rank"] == 0 and current == attempt:
            steps += 1
    return steps


def test_kill_restart_logs_and_stop_from_the_shell_then_ls_tells_the_outcome(ddptop_home, tmp_path):
    ckpt = tmp_path / "ckpt"
    cmd = [
        DDPTOP,
        "launch",
        "--headless",
        str(EXAMPLE),
        "--gpus",
        "2",
        "--steps",
        "100000",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "30",
        "--prometheus",  # whose server's shutdown, at the job's end, comes before meta.json says it ended
        f"127.0.0.1:{free_port()}",
    ]
    supervisor = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    follower = None
    try:
        run = wait_for(lambda: next(iter(rundir.all_runs()), None), 60, "the run directory")
        wait_for(lambda: attempt_steps(run, 0) > 60, 120, "steps past the first checkpoint")
        follower = subprocess.Popen([DDPTOP, "logs", run.id, "-f"], stdout=subprocess.PIPE, text=True)

        killed = run_ddptop("kill", run.id, "--rank", "1")
        assert killed.returncode == 0 and re.fullmatch(
            rf"ddptop: killed rank 1 of run {run.id}; torchrun restarted the group \(restart 1, 2 left\)\n", killed.stdout
        ), killed.stdout + killed.stderr
        # At once, while the group is between attempts: the restart waits for it to be up.
        restarted = run_ddptop("restart")  # the newest running job: this one
        assert restarted.returncode == 0 and "torchrun restarted the group (restart 2, 1 left)" in restarted.stdout, (
            restarted.stdout + restarted.stderr
        )
        wait_for(lambda: attempt_steps(run, 2) > 5, 120, "the group stepping again after the restart")

        dumped = run_ddptop("stacks", run.id)  # every rank, where it is now
        assert dumped.returncode == 0, dumped.stdout + dumped.stderr
        heads = re.findall(r"^==> rank (\d) \((py-spy --native|py-spy --nonblocking|faulthandler)\) <==$", dumped.stdout, re.M)
        assert sorted(rank for rank, _ in heads) == ["0", "1"], dumped.stdout
        assert "train.py" in dumped.stdout and re.search(r"[Tt]hread (\d+|0x[0-9a-f]+)", dumped.stdout), dumped.stdout
        assert {p.name.split(".")[0] for p in (run.path / "stacks").glob("rank*.txt")} == {"rank0", "rank1"}  # kept in the run
        unknown = run_ddptop("stacks", run.id, "--rank", "2")
        assert unknown.returncode == 2 and unknown.stderr == f"ddptop: error: run {run.id} has ranks 0-1: no rank 2\n", unknown.stderr

        job = psutil.Process(supervisor.pid).children(recursive=True)
        stopped = run_ddptop("stop", run.id[:15])
        assert stopped.returncode == 0 and stopped.stdout == f"ddptop: stopped run {run.id} (exit 143)\n", stopped.stdout + stopped.stderr
        assert run.state() == "stopped"  # as soon as stop has said so: `ddptop stop RUN && ddptop ls` agrees
        assert supervisor.wait(timeout=60) == 143
        wait_for(lambda: not [p for p in job if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 30, "no process left")
        followed, _ = follower.communicate(timeout=30)  # -f ends with the job
    finally:
        for proc in (supervisor, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
    attempts = [int(n) for n in re.findall(r"^==> attempt (\d+) <==$", followed, re.M)]
    assert attempts[0] == 0 and attempts[-1] == 2 and attempts == sorted(set(attempts)), attempts  # attempt 1 may have said nothing
    assert "[rank1 stderr]" in followed

    events = list(rundir.read_events(run))
    said = [r["text"] for r in events if r["type"] == "action"]
    assert "kill of rank 1 requested from the shell (ddptop kill)" in said and "stop requested from the shell (ddptop stop)" in said, said
    asked = [r.get("asked") for r in events if r["type"] == "group_restart"]  # each says why, not whom ddptop killed
    assert asked == [
        "kill of rank 1 requested from the shell (ddptop kill)",
        "restart of the group requested from the shell (ddptop restart)",
    ], asked
    again = run_ddptop("stop", run.id)
    assert again.returncode == 2 and f"run {run.id} has stopped: nothing to stop" in again.stderr
    (row,) = json.loads(run_ddptop("ls", "--json").stdout)
    assert (row["state"], row["exit_code"], row["why"]) == ("stopped", 143, None)
    assert row["steps"] > 60 and row["duration_s"] > 0
    split = row["goodput"]
    # Steps recomputed after the resume: none if the kill came right after a checkpoint.
    assert split["failures"] == 2 and split["restarts_s"] > 0 and split["recomputed_s"] >= 0 and 0 < split["goodput"] < 1
    assert "checkpoint_every_s" in split  # failures and checkpoint writes: Young/Daly's interval
    listed = run_ddptop("ls").stdout.splitlines()
    shown = f"{split['goodput']:.0%}"
    assert re.match(rf"{run.id}\s+stopped\s+2\s+\S+ \S+\s+\S+\s+\d+\s+143\s+{shown}\s+{re.escape(str(EXAMPLE))}$", listed[1]), listed
    assert run_ddptop("ls", "--running").stdout.startswith("no running runs")


def test_ls_says_why_a_run_failed(ddptop_home):
    done = run_ddptop("launch", "--headless", str(SCRIPTS / "early_failure.py"), "--gpus", "2")
    assert done.returncode == 1
    assert re.search(r"^ddptop: goodput 0% of [\d.]+ s; lost: startup", done.stdout, re.M), done.stdout
    (row,) = json.loads(run_ddptop("ls", "--json").stdout)
    assert row["state"] == "failed" and row["exit_code"] == 1 and row["steps"] is None
    assert row["why"].startswith("crash-loop: ") and "AttributeError" in row["why"] and "early_failure.py:11" in row["why"], row["why"]
    assert f"why: {row['why']}" in run_ddptop("ls").stdout


def test_ls_says_why_a_launch_failed_before_any_rank_started(ddptop_home):
    """torchrun's own failure (here its rendezvous backend), which no verdict explains."""
    args = ("--nnodes", "1", "--rdzv-backend", "bogus", "--rdzv-endpoint", "127.0.0.1:29555")
    done = run_ddptop("launch", "--headless", *args, str(SCRIPTS / "plain_ddp.py"), "--gpus", "1")
    assert done.returncode == 1
    (row,) = json.loads(run_ddptop("ls", "--json").stdout)
    assert row["state"] == "failed" and row["why"].startswith("torchrun failed: ValueError: ") and "bogus" in row["why"], row


MODULE = """
import argparse, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
parser = argparse.ArgumentParser()
parser.add_argument("--start", type=int)
parser.add_argument("--max", type=int)
args = parser.parse_args()
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(4, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.start, args.max):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
print("ran", args.start, args.max)
dist.destroy_process_group()
"""


def test_a_module_and_a_program_launch_as_under_torchrun_with_options_torchrun_would_have_taken(ddptop_home, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(MODULE)
    (tmp_path / "run.sh").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pkg.train "$@"\n')
    (tmp_path / "run.sh").chmod(0o755)
    for entry in (["-m", "pkg.train"], ["--no-python", "./run.sh"]):
        done = subprocess.run(
            [DDPTOP, "launch", "--headless", "--gpus", "2", *entry, "--start", "2", "--max", "5"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.count("ran 2 5") == 2 and re.search(r"\| steps 3 \|", done.stdout), done.stdout[-1500:]
    runs = json.loads(run_ddptop("ls", "--json").stdout)
    assert [r["script"] for r in runs] == ["-m pkg.train", str(tmp_path / "run.sh")] and runs[0]["id"].split("-")[2] == "train"
