"""The ways tutorials start data-parallel training, each under `ddptop launch` as written:
a script that spawns its own ranks (PyTorch's DDP tutorial), nn.DataParallel in one
process, and the override when the guess is wrong."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import psutil
import pytest
from support import DDPTOP, SCRIPTS, free_port, run_ddptop, wait_for

from ddptop.core import rundir
from ddptop.supervisor.watching.rules import nan as nan_rule

pytestmark = pytest.mark.slow

SPAWN = SCRIPTS / "spawn_tutorial.py"
NAN_AT = 5


def events(run: rundir.RunDir) -> list[dict]:
    return list(rundir.read_events(run)) if run.events_path.exists() else []


def stepped(run: rundir.RunDir, attempt: int, past: int) -> list[dict] | None:
    """The records so far, once both ranks of the attempt finished a step past `past`."""
    records = events(run)
    current: set[int] = set()
    last: dict[int, int] = {}
    for r in records:  # a rank's records follow its hello: a step counts once its attempt's hello came
        if r["type"] == "rank_hello":
            (current.add if r["restart"] == attempt else current.discard)(r["rank"])
        elif r["type"] == "step" and r["rank"] in current:
            last[r["rank"]] = r["step"]
    return records if len(current) == 2 and all(last.get(rank, -1) > past for rank in (0, 1)) else None


def test_a_spawn_tutorial_script_is_started_once_and_its_ranks_are_watched(ddptop_home, tmp_path):
    run = rundir.RunDir(tmp_path / "run")
    log = (tmp_path / "stderr").open("w")
    args = ["--steps", "100000", "--step-s", "0.02", "--nan-at", str(NAN_AT), "--port", str(free_port())]
    cmd = [DDPTOP, "launch", "--headless", "--run-dir", str(run.path), str(SPAWN), "--gpus", "2", *args]
    supervisor = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        records = wait_for(lambda: stepped(run, 0, NAN_AT + 2), 120, "steps of both spawned ranks")
        meta = json.loads(run.meta_path.read_text())
        assert (meta["launch_style"], meta["nproc_per_node"]) == ("spawn", 1)
        hellos = [r for r in records if r["type"] == "rank_hello"]
        assert sorted((h["rank"], h["world_size"]) for h in hellos) == [(0, 2), (1, 2)]
        # The ranks are the script's children, not torchrun's: torchrun started one process.
        spawner = psutil.Process(hellos[0]["pid"]).ppid()
        assert spawner == psutil.Process(hellos[1]["pid"]).ppid() and spawner != meta["torchrun_pid"]
        skipped = {r["rank"] for r in records if r["type"] == "step" and r["step"] == NAN_AT and r.get("skipped") == "nan"}
        assert skipped == {0, 1}, "the NaN of rank 1 was skipped on both ranks"
        # The verdict waits for every rank's record of the step, and the log is flushed once a second.
        wait_for(lambda: any(r["type"] == "alert" and r["kind"] == "nan" for r in events(run)), 30, "the NaN alert in the log")

        os.kill(next(h["pid"] for h in hellos if h["rank"] == 1), signal.SIGKILL)  # as the OOM killer would
        wait_for(lambda: stepped(run, 1, 3), 120, "both ranks stepping again after the restart")
        crash = next(r for r in events(run) if r["type"] == "alert" and r["kind"] == "crash")
        assert crash["text"].startswith("rank 1 was killed by SIGKILL"), crash["text"]  # as the spawn reported it

        job = psutil.Process(supervisor.pid).children(recursive=True)
        assert len(job) >= 4  # torchrun, the script, its two ranks (and its resource tracker)
        supervisor.kill()
        supervisor.wait(timeout=30)
        wait_for(lambda: not [p for p in job if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 30, "no process left")
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
        log.close()
    said = (tmp_path / "stderr").read_text()
    assert "spawn_tutorial.py starts its own ranks with torch.multiprocessing.spawn (line 71): started once" in said, said[-2000:]


def test_a_data_parallel_script_runs_once_as_one_process_with_steps_loss_and_its_nan_guard(ddptop_home, tmp_path):
    run = rundir.RunDir(tmp_path / "run")
    done = run_ddptop("launch", "--headless", "--run-dir", str(run.path), str(SCRIPTS / "data_parallel.py"), "--gpus", "2", "--nan-at", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("final ") == 1 and "nn.DataParallel (line 20): started once" in done.stderr
    records = events(run)
    assert [(r["rank"], r["world_size"]) for r in records if r["type"] == "rank_hello"] == [(0, 1)]
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(20)) and all(r["loss"] > 0 for r in steps if r["step"] != 3)
    assert [r["step"] for r in steps if r.get("skipped") == "nan"] == [3]
    nan = next(r for r in records if r["type"] == "alert" and r["kind"] == "nan")
    assert nan["text"] == nan_rule.ALERT.format(step=3, source=nan_rule.ALONE, handling=nan_rule.SKIPPED)


def test_the_launch_style_can_be_overridden_and_ls_says_which_and_why(ddptop_home, tmp_path):
    done = run_ddptop("launch", "--headless", "--launch-style", "single", str(SCRIPTS / "plain_ddp.py"), "--gpus", "2", "--steps", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--launch-style single (detected: torchrun): started once" in done.stderr
    (row,) = json.loads(run_ddptop("ls", "--json").stdout)
    assert (row["launch_style"], row["launch_reason"], row["ranks"]) == ("single", "--launch-style single (detected: torchrun)", 1)
    bad = run_ddptop("launch", "--launch-style", "threads", str(SCRIPTS / "plain_ddp.py"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "invalid choice: 'threads'" in bad.stderr, bad.stderr


def test_a_spawn_script_whose_children_never_join_a_group_is_said_to_have_no_ranks(ddptop_home, tmp_path):
    script = tmp_path / "pool.py"
    script.write_text(
        "import torch.multiprocessing as mp\n\ndef work(i):\n    print('child', i)\n\nif __name__ == '__main__':\n    mp.spawn(work, nprocs=2)\n"
    )
    done = run_ddptop("launch", "--headless", "--run-dir", str(tmp_path / "run"), str(script), "--gpus", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pool.py ended and no process it started called init_process_group: it ran with no rank" in done.stderr


def test_a_hard_coded_port_in_use_is_the_root_cause_with_the_line_that_sets_it(ddptop_home, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_ddptop("launch", "--headless", "--run-dir", str(tmp_path / "run"), str(SPAWN), "--gpus", "2", "--port", str(port))
    assert done.returncode != 0
    alert = next(line for line in done.stderr.splitlines() if line.startswith("ddptop: ALERT crash:"))
    assert alert.endswith(f"port {port} is already in use (MASTER_PORT is set at spawn_tutorial.py:22)"), alert
    assert "crash-loop" in done.stderr  # a port that stays taken: stopped, not restarted forever


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
