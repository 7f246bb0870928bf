"""The watchdog proven on real gloo jobs: each verdict from a fault injected
into a real rank (examples/train.py --inject) or a test script."""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from support import DDPTOP, EXAMPLE, SCRIPTS, counted_once_a_group, recorded

from ddptop.core import rundir
from ddptop.supervisor.watching.rules import nan
from ddptop.supervisor.watching.rules.crash import OOM_KILLED

pytestmark = pytest.mark.slow


class Job:
    """One finished `ddptop launch --headless` run and its event log."""

    def __init__(self, run_path: Path, proc: subprocess.CompletedProcess) -> None:
        self.proc = proc
        self.run = rundir.RunDir(run_path)
        self.records = recorded(self.run)

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["type"] == kind]

    def alerts(self, kind: str | None = None) -> list[dict]:
        return [a for a in self.of("alert") if kind is None or a["kind"] == kind]

    def steps(self, restart: int = 0) -> dict[int, dict[int, dict]]:
        """rank -> step -> record, for one attempt of the group."""
        attempt: dict[int, int] = {}
        out: dict[int, dict[int, dict]] = defaultdict(dict)
        for record in self.records:
            if record["type"] == "rank_hello":
                attempt[record["rank"]] = record["restart"]
            elif record["type"] == "step" and attempt.get(record["rank"]) == restart:
                out[record["rank"]][record["step"]] = record
        return out


def launch(tmp_path: Path, *args: str, timeout: float = 240, cgroup: Path | None = None) -> Job:
    """The job, in a cgroup of its own where one is given (its cgroup.procs joined before ddptop starts)."""
    run_path = tmp_path / "run"
    join = None if cgroup is None else lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    proc = subprocess.run(
        [DDPTOP, "launch", "--headless", "--run-dir", str(run_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=join,
    )
    return Job(run_path, proc)


def test_nan_inf_explosion_and_desync_on_four_ranks(ddptop_home, tmp_path):
    job = launch(
        tmp_path,
        str(EXAMPLE),
        "--gpus",
        "4",
        "--steps",
        "80",
        "--clip-grad",
        "1.0",
        "--desync-every",
        "10",
        "--inject",
        "nan@15:1",
        "--inject",
        "inf-grad@30:2",
        "--inject",
        "explode@45:0",
        "--inject",
        "desync@60:3",
    )
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    steps = job.steps()
    assert sorted(steps) == [0, 1, 2, 3] and all(sorted(rows) == list(range(80)) for rows in steps.values())

    # NaN/Inf: the same step skipped on every rank; the rank whose own loss was NaN named, and
    # gradients poisoned in backward from a finite loss said to be so (no rank's loss was bad).
    skipped = {(rank, n) for rank, rows in steps.items() for n, r in rows.items() if r.get("skipped")}
    assert skipped == {(rank, n) for rank in range(4) for n in (15, 30)}
    nan_alerts = sorted((a["step"], a["ranks"]) for a in job.alerts("nan"))
    assert nan_alerts == [(15, [1]), (30, [])]
    source = nan.OWN_LOSS.format(ranks="rank 1")
    assert "ALERT nan: " + nan.ALERT.format(step=15, source=source, handling=nan.SKIPPED_ALL) in job.proc.stderr
    assert nan.ALERT.format(step=30, source=nan.FINITE_LOSSES, handling=nan.SKIPPED_ALL) in job.proc.stderr
    assert "final-params-finite true" in job.proc.stdout
    assert all(math.isfinite(r["loss"]) for rows in steps.values() for n, r in rows.items() if n not in (15, 30))

    # Explosion: the pre-clip norm is reported, the step clipped on every rank.
    assert all(steps[rank][45]["clipped"] and steps[rank][45]["grad_norm"] > 1e3 for rank in range(4))

    # Desync: rank 3 nudged a parameter after step 60's update; step 70's checksums name it.
    [desync] = job.alerts("desync")
    assert desync["ranks"] == [3] and desync["step"] == 70
    sums = desync["checksums"]
    assert sums["0"] == sums["1"] == sums["2"] != sums["3"] and sums["3"] in desync["text"]
    assert {a["kind"] for a in job.alerts()} == {"nan", "desync"}


def test_a_pipeline_whose_stages_ddp_replicates_apart_is_judged_stage_by_stage(ddptop_home, tmp_path):
    """Ranks 0,2 hold stage 0 and ranks 1,3 stage 1, each stage all-reduced by DDP over its own
    group: the stages' parameters differ from step 0 on, which is no desync. Rank 2 drifts from
    rank 0 after step 12: the checksums of step 15 name the two, and the other stage is not named.
    Rank 3 then sticks before its 25th batch: its stage's group waits for it alone, as the hang
    alert says, though every rank's recorder numbers its own group 1."""
    script = str(SCRIPTS / "pipeline_ddp.py")
    job = launch(
        tmp_path, "--desync-every", "5", "--hang-timeout", "10", "--max-restarts", "0", script, "--gpus", "4",
        "--steps", "100000", "--drift-at", "12", "--drift-rank", "2", "--stuck-at", "25", "--stuck-rank", "3",
    )  # fmt: skip
    assert job.proc.returncode != 0, job.proc.stderr[-3000:]
    # A later stage's wait for its activations reads as its data wait (core/model/lag.py): on a
    # loaded 2-core host that wait can pass for a straggler's. What this test is about is the rest.
    alerts = [a for a in job.alerts() if a["kind"] != "straggler"]
    assert [a["kind"] for a in alerts] == ["desync", "hang"], [(a["kind"], a["text"]) for a in alerts]
    desync, hang = alerts
    assert (desync["kind"], desync["ranks"], desync["step"]) == ("desync", [0, 2], 15)
    assert "between the data-parallel ranks 0,2, no majority" in desync["text"]
    assert hang["kind"] == "hang" and "rank 3 stuck" in hang["text"], hang["text"]
    if "never entered" in hang["text"]:  # gloo's collectives are recorded since torch 2.8
        assert re.search(r"; group \S+: rank 1 in all_reduce #\d+ \([^)]*\); rank 3 never entered it, its last", hang["text"]), hang["text"]
    steps = job.steps()
    for n in range(0, 25, 5):
        assert [steps[r][n]["replicas"] for r in range(4)] == [[0, 2], [1, 3], [0, 2], [1, 3]]
        assert steps[1][n]["checksum"] == steps[3][n]["checksum"] != steps[0][n]["checksum"]
        assert (steps[0][n]["checksum"] == steps[2][n]["checksum"]) == (n < 15), n
    # Each sample passes through a rank of each stage: the job's samples/s counts it once.
    told = {r["rank"]: r["replicas"] for r in job.of("heartbeat") if "replicas" in r}
    assert told == {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    counted_once_a_group(job.records, ranks=4, groups=2)


@pytest.mark.parametrize("bucket_view", [False, True], ids=["gradients apart", "--bucket-view: clipped a bucket at a time"])
def test_clipping_is_enforced_when_the_script_never_clips(ddptop_home, tmp_path, bucket_view):
    given = ["--bucket-view"] if bucket_view else []
    job = launch(tmp_path, str(SCRIPTS / "clip_check.py"), "--gpus", "2", "--clip-grad", "1.0", *given, "--steps", "30")
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    # Found by pattern, not by line: with PYTHONUNBUFFERED=1 a rank writes a print's text and its
    # newline apart, and torchrun's tail threads may pass half a line on, joined to the next rank's.
    reports = re.findall(r"\[rank(\d+)\]:applied-steps (\d+) max-applied-grad-norm ([\d.]+) bucket-view (\w+)", job.proc.stdout)
    assert sorted(rank for rank, _, _, _ in reports) == ["0", "1"], job.proc.stdout[-2000:]
    for _, steps, norm, viewed in reports:
        assert steps == "30" and float(norm) <= 1.0 + 1e-6 and viewed == str(bucket_view), reports
    rows = [r for r in job.of("step")]
    assert all(r["clipped"] and r["grad_norm"] > 1.0 for r in rows)
    assert "clip 100%" in job.proc.stdout  # the summary line reports the clip rate


def test_hang_is_named_with_stacks_then_the_group_restarts(ddptop_home, tmp_path):
    job = launch(
        tmp_path,
        str(EXAMPLE),
        "--gpus",
        "4",
        "--steps",
        "40",
        "--hang-timeout",
        "10",
        "--max-restarts",
        "1",
        "--inject",
        "hang@20:2",
    )
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    [hang] = job.alerts("hang")
    lines = EXAMPLE.read_text().splitlines()
    blocked = next(n for n, line in enumerate(lines, 1) if "threading.Event().wait()" in line)
    assert hang["text"].startswith("no step for 1")
    assert f"ranks 0,1,3 wait in all-reduce at train.py:{blocked + 1} in main, after step 19; " in hang["text"]
    assert (
        "rank 2 stuck 1" in hang["text"] and f" s in forward at train.py:{blocked} in main, after step 19" in hang["text"]
    )  # its loss made, no backward begun
    found = re.search(
        r"default group: ranks 0,1,3 in all_reduce #(\d+) \([\d.]+ \w+\); rank 2 never entered it, its last: all_reduce #(\d+); stacks in (.+)$",
        hang["text"],
    )
    assert found and int(found[1]) == int(found[2]) + 1 and found[3] == str(job.run.stacks_path), hang["text"]
    last_step = max(r["wall"] for r in job.steps(restart=0)[0].values())
    assert hang["wall"] - last_step <= 12.0
    # The job's samples/s, as the headless line, the chart and Prometheus read it, falls while no
    # rank steps, rather than standing at its last steps' rate.
    rates = [(r["wall"] - last_step, r["metrics"]["samples_per_s"]) for r in job.of("summary") if r["wall"] < hang["wall"]]
    stepping = max(rate for _, rate in rates if rate is not None)
    stuck = [rate for since, rate in rates if since > 5.0]
    assert stuck and stuck[-1] < stepping / 5, rates

    stacks = {r["rank"]: r["text"] for r in job.of("stack")}
    assert sorted(stacks) == [0, 1, 2, 3]
    assert re.search(r"in main$|^\s+main \(", stacks[2], re.M) and "wait" in stacks[2]  # faulthandler's or py-spy's frame of main()
    assert "backward" in stacks[0]  # waiting for rank 2 inside the all-reduce
    assert len(list(job.run.stacks_path.glob("rank2.*.txt"))) == 1  # the dump, main thread first
    assert len(list(job.run.raw_stacks_path.glob("rank2.*.txt"))) == 2  # faulthandler's file, one per attempt

    assert [(r["restart"], r["ordered"]) for r in job.of("group_restart")] == [(1, "hang")]
    assert "torchrun restarts the worker group (restart 1, 0 left) after ddptop stopped it for the hang alert" in job.proc.stderr
    assert sorted(job.steps(restart=1)[0]) == list(range(40))
    assert job.alerts("crash") == []  # the kills were ours, not crashes


def test_a_rank_given_fewer_batches_that_ended_first_is_named_in_the_crash_it_caused(ddptop_home, tmp_path):
    """Rank 0 exits without error after its 20 batches; rank 1 fails in the all-reduce of its 21st.
    The alert blamed rank 1's "Connection closed by peer" alone; the cause is the uneven inputs."""
    job = launch(tmp_path, str(SCRIPTS / "uneven_ddp.py"), "--gpus", "2", "--max-restarts", "0")
    assert job.proc.returncode != 0
    [crash] = job.alerts("crash")
    assert crash["text"].startswith("rank 1 failed with exit code 1 after step 19"), crash["text"]
    assert crash["text"].endswith(
        "; rank 0 had exited without error after step 19 while the others trained on: "
        "the ranks ran unequal numbers of steps (uneven inputs: DDP's Join evens them out)"
    ), crash["text"]


def test_crash_then_segv_then_a_straggler(ddptop_home, tmp_path):
    job = launch(
        tmp_path,
        str(EXAMPLE),
        "--gpus",
        "4",
        "--steps",
        "80",
        "--max-restarts",
        "2",
        "--inject",
        "crash@10:1",
        "--inject",
        "segv@10:2/1",
        "--inject",
        "slow@5:3/2",
    )
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    first, second = job.alerts("crash")
    assert first["ranks"] == [1] and first["exitcode"] == 3 and "rank 1 failed with exit code 3" in first["text"]
    assert second["ranks"] == [2] and second["exitcode"] == -11
    assert "killed by SIGSEGV" in second["text"] and "Segmentation fault" in second["text"]
    assert any("Fatal Python error: Segmentation fault" in line for line in second["log"])
    assert [r["restart"] for r in job.of("group_restart")] == [1, 2]

    stragglers = job.alerts("straggler")
    assert [a["ranks"] for a in stragglers] == [[3]], [(a["ranks"], a["text"], a["wall"]) for a in stragglers]
    [straggler] = stragglers
    assert straggler["ratio"] > 2.0
    assert straggler["text"].endswith(f"; what differs: ddptop profile {job.run.id} --ranks 3,0"), straggler["text"]
    slow_from = min(r["wall"] for r in job.of("step") if r["rank"] == 3 and r["step"] == 5 and r["wall"] > second["wall"])
    assert straggler["wall"] - slow_from < 30.0
    assert "final-params-sha256" in job.proc.stdout


def test_on_nan_stop_stops_the_job_with_a_clear_message(ddptop_home, tmp_path):
    job = launch(tmp_path, str(EXAMPLE), "--gpus", "2", "--steps", "400", "--on-nan", "stop", "--inject", "nan@5:0")
    assert job.proc.returncode == 1
    assert "ddptop: stopping the job after the nan alert" in job.proc.stderr
    assert "Traceback" not in job.proc.stderr
    assert job.of("exit")[0]["code"] == 1 and job.run.state() == "failed"
    assert max(r["step"] for r in job.of("step")) < 399


def test_a_clean_run_raises_no_alert(ddptop_home, tmp_path):
    job = launch(tmp_path, str(EXAMPLE), "--gpus", "4", "--steps", "500")
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    assert job.alerts() == [], [a["text"] for a in job.alerts()]
    rows = job.steps()
    assert all(len(r) == 500 for r in rows.values())
    assert all(rows[rank][n]["checksum"] == rows[0][n]["checksum"] for rank in range(4) for n in range(0, 500, 100))


def test_scaler_skips_are_not_nan_faults(ddptop_home, tmp_path):
    job = launch(tmp_path, str(SCRIPTS / "scaler_ddp.py"), "--gpus", "2", "--steps", "20", "--inf-at", "5", "--inf-at", "11")
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    steps = job.steps()
    assert all(sorted(rows) == list(range(20)) for rows in steps.values())
    skipped = {(rank, n, r.get("skipped")) for rank, rows in steps.items() for n, r in rows.items() if r.get("skipped")}
    assert skipped == {(rank, n, "scaler") for rank in (0, 1) for n in (5, 11)}
    assert all(0 < rows[n]["loss"] < 10 for rows in steps.values() for n in (5, 11))  # the skipped steps' own losses, unscaled
    assert job.alerts() == []


def test_a_failure_that_repeats_is_stopped_as_a_crash_loop_in_one_line(ddptop_home, tmp_path):
    """A bad --inject fails every attempt alike, before the first step: two tries, then one clear stop, exit 2."""
    job = launch(tmp_path, str(EXAMPLE), "--gpus", "2", "--inject", "nan@5:7")
    assert job.proc.returncode == 2
    lines = job.proc.stderr.splitlines()
    errors = [line for line in lines if line.startswith("[rank") and "error:" in line]
    # Rank 0 says why in an attempt, unless silent rank 1 exits first and
    # torchrun stops rank 0 before it gets there (still the same failure).
    assert len(errors) <= 2, job.proc.stderr[-4000:]
    assert set(errors) <= {"[rank0]:train.py: error: --inject nan@5:7: rank 7 is outside the world of 2 ranks"}
    # The second restart is announced and held until the watchdog has judged it: the stop comes first, no third attempt.
    restarts = job.of("group_restart")
    assert [(r["restart"], r["exitcode"], r["backoff_s"]) for r in restarts] == [(1, 2, 0.0), (2, 2, 1.0)]
    assert {r["restart"] for r in job.of("rank_hello")} == {0, 1}
    [loop] = job.alerts("crash-loop")
    assert loop["text"].startswith("the same failure before the first step in attempts 0 and 1: a restart cannot help")
    # Both ranks exit 2 at the same moment (rank 1 without a word): either may be named first.
    assert re.search(r"stopping the job: rank [01] failed with exit code 2", loop["text"]), loop["text"]
    assert "ddptop: stopping the job after the crash-loop alert" in lines
    assert "Traceback" not in job.proc.stderr


def test_an_early_failure_that_repeats_is_named_at_its_line_and_not_restarted_again(ddptop_home, tmp_path):
    """An AttributeError before the first step: one restart to be sure, then a stop in one line, exit 1."""
    job = launch(tmp_path, str(SCRIPTS / "early_failure.py"), "--gpus", "2", "--max-restarts", "3")
    assert job.proc.returncode == 1, job.proc.stderr[-3000:]
    crashes = job.alerts("crash")
    assert len(crashes) == 2
    assert "has no attribute 'to_device' at early_failure.py:11 in <module>" in crashes[0]["text"]
    [stop] = job.alerts("crash-loop")
    assert stop["text"].startswith("the same failure before the first step in attempts 0 and 1: a restart cannot help")
    assert {r["restart"] for r in job.of("rank_hello")} == {0, 1}  # no third attempt
    assert "ddptop: stopping the job after the crash-loop alert" in job.proc.stderr.splitlines()


def test_restarts_that_make_no_progress_stop_the_job_in_one_line(ddptop_home, tmp_path):
    """Each attempt fails at step 15 for another reason: the crash-loop rule sees no two alike,
    and the job is stopped once three attempts in a row got no further than the first."""
    job = launch(tmp_path, str(SCRIPTS / "no_progress.py"), "--gpus", "2", "--max-restarts", "8", "--restart-backoff", "0")
    assert job.proc.returncode != 0, job.proc.stderr[-3000:]
    [stop] = job.alerts("no-progress")
    assert stop["text"].startswith("3 attempts in a row got no further (past step 15: attempt 1 to step 15"), stop["text"]
    assert stop["action"] == "stop" and not job.alerts("crash-loop")
    first = job.alerts("crash")[0]["text"]  # raised after its optimizer step: in its data wait, not at its exit
    assert "after step 15 (in data): RuntimeError: disk quota exceeded at no_progress.py:22 in <module>" in first, first
    assert {r["restart"] for r in job.of("rank_hello")} == {0, 1, 2, 3}, "no fifth attempt"
    assert "ddptop: stopping the job after the no-progress alert" in job.proc.stderr.splitlines()


def test_a_rank_the_kernel_kills_for_memory_is_said_to_have_run_out_of_it(ddptop_home, tmp_path, memory_limited_cgroup):
    """A job whose rank 1 leaks, in a cgroup limited to 1.5 GiB: the kernel's OOM killer sends it
    SIGKILL, and its exit says no more than that. torchrun's memory cgroup counted the kill."""
    job = launch(tmp_path, "--max-restarts", "0", str(SCRIPTS / "memory_hog.py"), "--gpus", "2", cgroup=memory_limited_cgroup)
    assert job.proc.returncode == 128 + 9, job.proc.stderr[-2000:]
    [crash] = job.alerts("crash")
    assert crash["ranks"] == [1] and crash["text"].startswith("rank 1 was killed by SIGKILL after step 3"), crash["text"]
    assert crash["text"].endswith(OOM_KILLED.format(count="a process", node=0)), crash["text"]
