"""`ddptop profile` on a real 2-rank gloo job whose ranks are each slow in their own way."""

from __future__ import annotations

import gzip
import json
import subprocess

import pytest
from support import DDPTOP, SCRIPTS, recorded, run_ddptop, wait_for

from ddptop.core import rundir

pytestmark = pytest.mark.slow


def test_a_capture_of_two_ranks_names_each_ones_cause_and_writes_traces_that_open(ddptop_home, tmp_path):
    run = rundir.RunDir(tmp_path / "run")
    job = subprocess.Popen(
        [
            DDPTOP,
            "launch",
            "--headless",
            "--run-dir",
            str(run.path),
            str(SCRIPTS / "slow_ranks.py"),
            "--gpus",
            "2",
            "--",
            "--seconds",
            "120",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: run.events_path.exists() and any(r["type"] == "step" and r["step"] >= 5 for r in rundir.read_events(run)), 90, "steps"
        )
        refused = run_ddptop("profile", str(run.path), "--rank", "7")
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "rank 7 is not running in this job (running: 0,1)" in refused.stderr
        done = run_ddptop("profile", str(run.path), "--ranks", "0,1", "--steps", "5", timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        said = done.stdout
        [data] = [line for line in said.splitlines() if line.startswith("  rank 0: ")]
        [compute] = [line for line in said.splitlines() if line.startswith("  rank 1: ")]
        # Under load another phase may pass the 5% floor too ("+3.7 ms in backward"): it comes
        # between the data wait and the ops, each in its place.
        assert data.startswith("  rank 0: +") and " ms in data wait; " in data and "; enumerate(DataLoader)" in data, said
        assert " ms in forward;" in compute and "aten::mm +" in compute and "waiting for the other ranks" in compute, said
        captures = wait_for(
            lambda: [r for r in recorded(run) if r["type"] == "profile"][1:] and [r for r in recorded(run) if r["type"] == "profile"],
            30,
            "the profile records logged",
        )
        assert sorted(r["rank"] for r in captures) == [0, 1] and len({r["first_step"] for r in captures}) == 1, "the same steps"
        for capture in captures:
            with gzip.open(capture["path"]) as trace:
                events = json.load(trace)["traceEvents"]
            names = {str(event.get("name")) for event in events}
            assert any(name.startswith("ProfilerStep#") for name in names) and "aten::addmm" in names
            assert "DistributedDataParallel.forward" in names and any(name.startswith("Optimizer.step#SGD") for name in names)
    finally:
        run_ddptop("stop", str(run.path), timeout=120)
        job.wait(120)
    gone = run_ddptop("profile", str(run.path))
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "nothing to profile" in gone.stderr, gone.stderr
    zero = run_ddptop("profile", str(run.path), "--steps", "0")
    assert zero.returncode == 2 and "--steps: 0: from 1 to 100" in zero.stderr
