"""Stall verdicts in seconds, pauses that are not stalls, stragglers that are not one long step: plain records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import wait_for
from test_watchdog import Clock, feed, hello, make, seconds, step

from ddptop.core.model.job import JobState
from ddptop.core.policy import WatchPolicy
from ddptop.supervisor.watching.failures import LogTail
from ddptop.supervisor.watching.rules.stall import MOVING_S, STALL_MIN_S, STALL_PACE
from ddptop.supervisor.watching.stuck import Standing, describe, in_collectives
from ddptop.supervisor.watching.verdict import Verdict
from ddptop.supervisor.watching.watchdog import Watchdog
from ddptop.trainer import flightrecorder


def beat(rank: int, step_in_progress: int, phase: str, **extra: object) -> dict:
    """A heartbeat; phase "all-reduce" is a rank in DDP's all-reduce at the end of its backward,
    as its flight recorder tells it (the step's collective entered, not completed)."""
    if phase == "all-reduce":
        phase, extra = "backward", {"collectives": [told(step_in_progress + 1, step_in_progress)], **extra}
    return {"type": "heartbeat", "rank": rank, "wall": 0.0, "phase": phase, "step": step_in_progress, "dropped": 0, **extra}


def test_the_text_groups_ranks_by_where_they_stand_largest_group_first():
    waiting = Standing(True, "all-reduce", "train.py:51 in train_step", 199)
    stuck = Standing(False, "data", "data.py:43 in batches", 199)
    text = describe({0: waiting, 1: waiting, 2: waiting, 3: stuck}, {0: 20.0, 3: 25.4}, {})
    assert text == (
        "ranks 0,1,2 wait in all-reduce at train.py:51 in train_step, after step 199; "
        "rank 3 stuck 25 s in data at data.py:43 in batches, after step 199"
    )
    early = Standing(False, "startup", None, -1)
    assert describe({1: early, 2: early}, {1: 3.0, 2: 130.0}, {0: 41.0}) == (
        "ranks 1,2 stuck 130 s in startup, before the first step; rank 0 sent nothing for 41 s"
    )
    leaving = Standing(False, "exit", "train.py:90 in <module>", 499)
    assert describe({1: leaving}, {1: 31.0}, {}) == "rank 1 stuck 31 s shutting down at train.py:90 in <module>, after step 499"
    joined = Standing(False, "joined", "train.py:15 in <module>", 299)
    assert (
        describe({0: joined}, {0: 20.0}, {}) == "rank 0 stuck 20 s out of data under DDP's Join at train.py:15 in <module>, after step 299"
    )


def test_a_rank_whose_place_is_not_known_yet_is_grouped_beside_one_whose_place_is():
    """A rank that has told no place yet (no heartbeat with one) stands at None: the text still
    comes, rather than the watchdog's tick failing to order None against a place."""
    told_place = Standing(True, "all-reduce", "train.py:51 in train_step", 9)
    no_place = Standing(True, "all-reduce", None, 9)
    assert describe({0: told_place, 1: no_place}, {}, {}) == (
        "rank 1 waits in all-reduce, after step 9; rank 0 waits in all-reduce at train.py:51 in train_step, after step 9"
    )


def stepping(world: int, steps: int, clock, dog, state, step_s: float = 0.1) -> None:
    for n in range(steps):
        clock.now += step_s
        for rank in range(world):
            feed(dog, state, step(rank, n, step_ms=step_s * 1000))


def test_a_rank_stuck_in_its_data_while_the_others_wait_is_named_within_the_window():
    """The stuck rank's last step record is still held in the rank: its heartbeat says it finished it."""
    dog, state, clock = make(world=4)
    stepping(4, 30, clock, dog, state)
    assert dog.liveness.done == dict.fromkeys(range(4), 29)
    clock.now += 0.05
    # Ranks 0-2 wait in step 30's all-reduce.
    for rank in range(3):
        feed(
            dog,
            state,
            beat(rank, 30, "all-reduce", where="train.py:51 in train_step", stack=["train.py:60 in <module>", "train.py:51 in train_step"]),
        )
    # Rank 3 finished step 30 (record held until its next forward) and sits in its loader.
    feed(dog, state, beat(3, 31, "data", where="data.py:43 in batches", stack=["train.py:58 in <module>", "data.py:43 in batches"]))
    assert dog.liveness.done[3] == 30
    window = STALL_MIN_S
    for _ in range(int(window) - 1):
        clock.now += 1.0
        for rank in range(4):  # heartbeats go on; nothing moves
            feed(dog, state, beat(rank, 30, "all-reduce") if rank < 3 else beat(rank, 31, "data", collectives=[told(30, 30)]))
        assert [v for v in dog.tick() if v.kind != "straggler"] == []
    clock.now += 1.1
    [v] = dog.tick()
    assert v.kind == "stall" and v.action == "none" and v.ranks == [3] and v.stacks == [0, 1, 2, 3]
    assert v.text == (
        "no step for 15 s: ranks 0,1,2 wait in all-reduce at train.py:51 in train_step, after step 29; "
        "rank 3 stuck 15 s in data at data.py:43 in batches, after step 30; "
        "default group: ranks 0,1,2 in all_reduce #31 (25.0 MiB); rank 3 never entered it, its last: all_reduce #30"
    )
    assert v.details["window_s"] == window
    clock.now += 5
    assert dog.tick() == []  # one verdict per stall


def test_a_rank_stuck_after_an_all_reduce_its_recorder_never_marked_completed_is_stuck_not_waiting():
    """Gloo's recorder marks a rank's own completion late, if ever: rank 2's says step 29's all-reduce
    (#30) is still running, though ranks 0 and 1 completed it and wait in #31. It is done on every
    rank, so rank 2, in its loader since, is stuck in data (seen on a loaded CI run of
    stuck_loader.py, where rank 1 read 'waits in all-reduce at stuck_loader.py:42 in __getitem__')."""
    dog, state, clock = make(world=3)
    stepping(3, 30, clock, dog, state)
    verdicts = []
    for _ in range(int(STALL_MIN_S) + 2):
        clock.now += 1.0
        for rank in range(2):
            feed(dog, state, beat(rank, 30, "all-reduce", where="train.py:51 in train_step"))
        feed(dog, state, beat(2, 30, "data", where="data.py:43 in __getitem__", collectives=[told(30, 29)]))
        verdicts += [v for v in dog.tick() if v.kind != "straggler"]
    [v] = verdicts
    assert v.kind == "stall" and v.ranks == [2]
    assert "rank 2 stuck 15 s in data at data.py:43 in __getitem__, after step 29" in v.text, v.text


def test_the_window_follows_the_job_s_pace_and_leaves_a_longer_one_to_the_hang_rule():
    dog, state, clock = make(world=2, policy=WatchPolicy(hang_timeout=60))
    stepping(2, 20, clock, dog, state, step_s=2.0)
    rule = next(r for r in dog.rules if type(r).__name__ == "StallRule")
    assert rule.window() == STALL_PACE * 2.0
    clock.now += STALL_PACE * 2.0 + 1
    [v] = dog.tick()
    assert v.kind == "stall"
    dog, state, clock = make(world=2, policy=WatchPolicy(hang_timeout=30))
    stepping(2, 20, clock, dog, state, step_s=2.0)
    clock.now += 31
    assert [v.kind for v in dog.tick()] == ["hang"]  # a 40 s window is past the user's 30 s timeout


def test_a_rank_that_evaluates_while_the_others_wait_is_a_pause_not_a_stall_or_a_hang():
    dog, state, clock = make(world=4, policy=WatchPolicy(hang_timeout=30))
    stepping(4, 100, clock, dog, state)
    for rank in range(1, 4):
        feed(dog, state, beat(rank, 100, "all-reduce", stack=["train.py:51 in train_step"]))
    verdicts = []
    for second in range(45):  # rank 0 evaluates for 45 s: forwards advance, its stack moves
        clock.now += 1.0
        where = "train.py:120 in evaluate"
        feed(dog, state, beat(0, 100, "data", where=where, forwards=1000 + second, stack=[f"model.py:{10 + second % 7} in forward"]))
        for rank in range(1, 4):
            feed(dog, state, beat(rank, 100, "all-reduce"))
        verdicts += dog.tick()
    [note] = verdicts
    assert note.notice and note.kind == "pause" and note.record()["type"] == "notice"
    assert note.text == "ranks 1,2,3 wait for rank 0, at train.py:120 in evaluate"
    for rank in range(4):  # the evaluation ends, and the ranks finish step 100
        feed(dog, state, step(rank, 100))
    clock.now += MOVING_S + STALL_MIN_S + 1  # then every rank sits still: now it is a stall
    assert [v.kind for v in dog.tick()] == ["stall"]


def while_rank_1_waits(dog, state, clock, seconds: int, beat_0, **sampled_0: float) -> list:
    """A second at a time: rank 0's heartbeat (beat_0 of the second), rank 1's from inside a
    barrier, its CPU busy (CUDA spins while it waits), and a sample of both (rank 0's as given);
    the verdicts."""
    verdicts = []
    for second in range(seconds):
        clock.now += 1.0
        feed(dog, state, beat_0(second))
        feed(dog, state, beat(1, 100, "all-reduce", inside="barrier"))
        procs = [{"rank": 0, "pid": 100, **sampled_0}, {"rank": 1, "pid": 101, "cpu": 100.0, "io": 0.0}]
        feed(dog, state, {"type": "sample", "wall": 0.0, "procs": procs, "gpus": []})
        verdicts += dog.tick()
    return verdicts


def test_a_rank_that_evaluates_through_model_module_is_seen_working_by_its_busy_cpu():
    """Rank 0 evaluates alone through `model.module` (no DDP forward to count) a model whose
    blocks are one code: its stack reads the same at every heartbeat, but it keeps a CPU busy,
    so it is a pause, not a stall, and no hang. A rank as busy inside a collective (CUDA spins
    while it waits) or at 5% is still."""
    dog, state, clock = make(world=2, policy=WatchPolicy(hang_timeout=30))
    stepping(2, 100, clock, dog, state)
    conv = ["train.py:120 in evaluate", "torch/nn/modules/conv.py:560 in _conv_forward"]
    evaluating = beat(0, 100, "data", where="train.py:120 in evaluate")
    verdicts = while_rank_1_waits(
        dog, state, clock, 45, lambda second: {**evaluating, "stack": conv} if not second else evaluating, cpu=99.0
    )
    assert [(v.kind, v.text) for v in verdicts] == [("pause", "rank 1 waits for rank 0, at train.py:120 in evaluate")]
    for rank in range(2):
        feed(dog, state, step(rank, 100))
    for _ in range(int(STALL_MIN_S) + 5):  # then rank 0 hangs at 5% of a core: a stall
        clock.now += 1.0
        feed(dog, state, {"type": "sample", "wall": 0.0, "procs": [{"rank": 0, "pid": 100, "cpu": 5.0}], "gpus": []})
        verdicts += dog.tick()
    assert [v.kind for v in verdicts] == ["pause", "stall"]


def test_a_rank_writing_a_checkpoint_to_slow_storage_is_a_pause_until_its_writes_stop():
    """Rank 0 saves a checkpoint to slow storage: asleep in the kernel, its CPU idle and its stack on
    one line, while it writes 4 MiB a second. A pause that says so, not a stall, though its flight
    recorder has not marked DDP's last all-reduce completed (gloo's may never). A write that hangs
    (a dead NFS server) moves no bytes: then it is a stall."""
    dog, state, clock = make(world=2, policy=WatchPolicy(hang_timeout=60))
    stepping(2, 100, clock, dog, state)
    save = ["train.py:200 in save_checkpoint", "torch/serialization.py:967 in save"]
    stale = [told(100, 99)]  # step 99's all-reduce, done when its backward returned
    saving = beat(0, 100, "checkpoint", where="train.py:200 in save_checkpoint", collectives=stale)
    verdicts = while_rank_1_waits(
        dog, state, clock, 45, lambda second: {**saving, "stack": save} if not second else saving, cpu=3.0, io=4.0 * (1 << 20)
    )
    assert [(v.kind, v.text) for v in verdicts] == [("pause", "rank 1 waits for rank 0, checkpointing at train.py:200 in save_checkpoint")]
    for _ in range(int(STALL_MIN_S) + 5):
        clock.now += 1.0
        feed(dog, state, beat(0, 100, "checkpoint", where="train.py:200 in save_checkpoint"))
        feed(dog, state, {"type": "sample", "wall": 0.0, "procs": [{"rank": 0, "pid": 100, "cpu": 0.0, "io": 0.0}], "gpus": []})
        verdicts += dog.tick()
    assert [v.kind for v in verdicts] == ["pause", "stall"]
    assert "rank 0 stuck 15 s in checkpoint at train.py:200 in save_checkpoint, after step 99" in verdicts[-1].text


def test_a_rank_that_burns_a_core_holding_the_gil_and_sends_nothing_is_stuck_not_working():
    """A regex that backtracks for ever holds the GIL in native code: the rank's CPU is busy, but its
    heartbeats stop. That is a stall."""
    dog, state, clock = make(world=2)
    stepping(2, 100, clock, dog, state)
    verdicts = []
    for _ in range(int(STALL_MIN_S) + 5):
        clock.now += 1.0
        feed(dog, state, beat(1, 100, "all-reduce", inside="all_reduce"))
        procs = [{"rank": 0, "pid": 100, "cpu": 100.0}, {"rank": 1, "pid": 101, "cpu": 1.0}]
        feed(dog, state, {"type": "sample", "wall": 0.0, "procs": procs, "gpus": []})
        verdicts += dog.tick()
    assert [v.kind for v in verdicts] == ["stall"]


def test_one_long_step_is_not_a_straggler_but_a_slower_median_is():
    dog, state, clock = make(world=4)
    for n in range(60):
        for rank in range(4):
            evaluating = rank == 0 and n == 30  # rank 0 evaluates between steps 29 and 30: a long data wait
            data = 40_000.0 if evaluating else 0.5
            comm = 0.0 if evaluating else (40_000.0 if n == 30 else 5.0)
            feed(dog, state, {**step(rank, n), "step_ms": data + 10.0 + comm, "data_ms": data, "compute_ms": 10.0, "comm_ms": comm})
    assert [v for v in seconds(dog, clock, 5) if v.kind == "straggler"] == []
    for n in range(60, 120):
        for rank in range(4):
            busy = 25.0 if rank == 2 else 10.0
            feed(dog, state, {**step(rank, n), "step_ms": 30.0, "data_ms": 0.0, "compute_ms": busy, "comm_ms": 30.0 - busy})
    assert [v.ranks for v in seconds(dog, clock, 5) if v.kind == "straggler"] == [[2]]


def told(enqueued: int, completed: int, group: str = "0", op: str = "all_reduce", nbytes: int = 25 << 20) -> dict:
    name = "default group" if group == "0" else f"group {group}"
    return {"group": group, "name": name, "enqueued": enqueued, "completed": completed, "op": op, "bytes": nbytes}


def test_the_collective_each_group_waits_in_and_the_rank_that_never_entered_it_are_named():
    reports = {r: [told(5512, 5511)] for r in (0, 1, 2)} | {3: [told(5511, 5511)]}
    assert in_collectives(reports) == [
        "default group: ranks 0,1,2 in all_reduce #5512 (25.0 MiB); rank 3 never entered it, its last: all_reduce #5511"
    ]
    everyone_done = {r: [told(9, 9)] for r in range(3)}
    assert in_collectives(everyone_done) == [], "no one waits: nothing to say of the group"


def test_a_collective_completed_on_some_ranks_has_no_one_waiting_in_it():
    """DDP's last all-reduce before every rank went to wait elsewhere: ranks 0 and 2 have it
    completed, rank 1's recorder not yet (a CI run caught gloo's recorder behind): it was
    entered by all, and nobody waits in it."""
    reports = {0: [told(46, 46)], 1: [told(46, 45)], 2: [told(46, 46)]}
    assert in_collectives(reports) == []


def test_a_rank_that_tells_nothing_of_its_collectives_is_left_to_the_rest_of_the_verdict():
    reports = {r: [told(40, 39)] for r in (0, 1)}
    assert in_collectives(reports) == ["default group: ranks 0,1 in all_reduce #40 (25.0 MiB)"]


def test_a_subgroup_that_hangs_is_named_and_the_default_group_that_is_fine_is_not():
    reports = {
        0: [told(30, 30), told(8, 7, group="1", op="broadcast", nbytes=4096)],
        1: [told(30, 30), told(7, 7, group="1", op="all_reduce", nbytes=0)],
        2: [told(30, 30)],
    }
    assert in_collectives(reports) == ["group 1: rank 0 in broadcast #8 (4.0 KiB); rank 1 never entered it, its last: all_reduce #7"]
    waiting = Standing(True, "broadcast", None, 9)
    assert describe({0: waiting}, {}, {}, in_collectives(reports)).endswith(
        "; group 1: rank 0 in broadcast #8 (4.0 KiB); rank 1 never entered it, its last: all_reduce #7"
    )


def nccl_entry(seq: int, state: str) -> dict:
    """An entry of NCCL's own recorder as `_dump_nccl_trace` gives it (seen on an H200, torch 2.11)."""
    return {
        "record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq, "p2p_seq_id": 0,
        "op_id": seq, "profiling_name": "nccl:all_reduce", "input_sizes": [[21]], "input_dtypes": ["Float"],
        "output_sizes": [[21]], "output_dtypes": ["Float"], "state": state, "retired": state == "completed", "is_p2p": False,
    }  # fmt: skip


def test_nccl_s_recorder_layout_is_read_its_entries_telling_what_completed():
    """NCCL's recorder keeps last_completed_collective at -1 unless timing is on; its entries'
    states say what completed. Here five all-reduces: four done, the fifth still running."""
    trace = {
        "version": "2.10",
        "pg_status": {"0": {"last_enqueued_collective": 5, "last_started_collective": -1, "last_completed_collective": -1}},
        "entries": [nccl_entry(seq, "completed" if seq < 5 else "scheduled") for seq in range(1, 6)],
    }
    [group] = flightrecorder.recorded(trace)
    assert group == {"group": "0", "name": "default group", "enqueued": 5, "completed": 4, "op": "all_reduce", "bytes": 84}
    assert flightrecorder.recorded({"pg_status": {"0": {"last_enqueued_collective": -1}}}) == [], "a group that entered nothing"
    assert flightrecorder.recorded({"entries": "not a list"}) == []


def test_a_subgroup_is_matched_by_the_name_its_ranks_share_not_by_each_rank_s_count_of_its_groups():
    """A pipeline's stages each all-reduce over a group of their own, ranks 0,2 and ranks 1,3. On
    every rank its group is the first beyond the default, pg_id 1, by which the recorder's status
    counts (gloo's layout, torch 2.13, as rank 1 gave it); the group's name ("1" for ranks 0,2's,
    "2" for ranks 1,3's) is what its ranks share. Matched by pg_id, rank 3 stuck in its data read
    as 'group 1: rank 1 in all_reduce #36; ranks 0,2,3 never entered it'."""

    def trace(name: str, enqueued: int) -> dict:
        entry = {**nccl_entry(enqueued, "scheduled"), "pg_id": 1, "process_group": (name, "undefined"), "profiling_name": "gloo:all_reduce"}
        status = {"last_enqueued_collective": enqueued, "last_started_collective": -1, "last_completed_collective": 35}
        return {"pg_status": {"1": status}, "entries": [entry]}

    reports = {rank: flightrecorder.recorded(trace(str(1 + rank % 2), 36 if rank == 1 else 35)) for rank in range(4)}
    assert [(r[0]["group"], r[0]["name"]) for r in reports.values()] == [("1", "group 1"), ("2", "group 2")] * 2
    assert in_collectives(reports) == ["group 2: rank 1 in all_reduce #36 (84 B); rank 3 never entered it, its last: all_reduce #35"]


RECORDED = """
import sys, torch, torch.distributed as dist
from ddptop.trainer import flightrecorder
assert flightrecorder.collectives() is None  # no group yet
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
for _ in range(3):
    dist.all_reduce(torch.ones(4))
print(flightrecorder.collectives())
dist.destroy_process_group()  # torch's own gloo aborts at exit about one time in ten without it
"""


@pytest.mark.slow
def test_a_real_gloo_group_s_recorder_is_read_in_a_fresh_process_as_a_rank_s(tmp_path):
    """The recorder is process-wide and counts every group the process made: a rank's own process, not pytest's."""
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"}
    out = subprocess.run([sys.executable, "-c", RECORDED, str(tmp_path / "store")], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    [group] = json.loads(out.stdout.replace("'", '"'))
    assert group["group"] == "0" and group["name"] == "default group" and group["op"] == "all_reduce" and group["bytes"] == 16
    assert group["enqueued"] == 3 and group["completed"] <= 3  # completion is marked on gloo's own thread, a moment later


def test_the_launcher_turns_the_recorder_on_unless_the_user_chose(tmp_path):
    from pathlib import Path

    import torch

    from ddptop.supervisor.launching.torchrun import JobPlan, environment
    from ddptop.trainer import flightrecorder

    plan = JobPlan(Path("train.py"), [], 2, 0, tmp_path, "unix:/s", True, tmp_path)
    on = environment(plan, {})  # the installed torch's name only: no deprecation warning on every rank
    [name] = flightrecorder.env_for(torch.__version__)
    assert on[name] == "2000" and not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} - {name} & set(on)
    off = environment(plan, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})
    assert off["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0" and "TORCH_FR_BUFFER_SIZE" not in off
    assert flightrecorder.env_for("2.7.1+cu126") == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    assert flightrecorder.env_for("2.8.0") == flightrecorder.env_for("unknown") == {"TORCH_FR_BUFFER_SIZE": "2000"}


def test_the_wall_clock_stepping_back_and_forth_gives_no_verdict():
    """Ranks' wall times jump an hour back, then a day forward (NTP, a VM resumed): every duration
    the watchdog judges is on the supervisor's monotonic clock, so nothing is said of it."""
    dog, state, clock = make(world=4, policy=WatchPolicy(hang_timeout=30))
    verdicts = []
    for n in range(300):
        clock.now += 0.1
        wall = 1_800_000_000.0 + n * 0.1 + (-3600.0 if 100 <= n < 200 else 86_400.0 if n >= 200 else 0.0)
        for rank in range(4):
            verdicts += feed(dog, state, step(rank, n, step_ms=100.0, wall=wall))
            if n % 10 == 0:
                verdicts += feed(dog, state, beat(rank, n + 1, "data", wall=wall))
        verdicts += dog.tick()
    assert verdicts == []


def test_a_quiet_rank_is_said_to_be_stopped_and_where_it_was_last():
    """A SIGSTOPped rank sends nothing: the system says it is stopped, its last heartbeat where it was."""
    import signal
    import socket

    from ddptop.core.model.rank import RankState
    from ddptop.supervisor.watching.stuck import quiet_rank

    # A process starting up may be in state D for a moment (reading its interpreter's pages from
    # a busy disk): it says when it is past that, and the test waits for its sleep to be seen.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == b"\n"
        rank = RankState(1, pid=sleeper.pid, host=socket.gethostname(), where="train.py:51 in _run_batch")
        assert wait_for(lambda: quiet_rank(rank) == "last at train.py:51 in _run_batch", 5, "a sleeping process says nothing more")
        os.kill(sleeper.pid, signal.SIGSTOP)
        assert wait_for(lambda: quiet_rank(rank) == "stopped by SIGSTOP, last at train.py:51 in _run_batch", 5, "the stop seen")
        elsewhere = RankState(1, pid=sleeper.pid, host="another-host", where="train.py:51 in _run_batch")
        assert quiet_rank(elsewhere) == "last at train.py:51 in _run_batch", "another host's pid is not this one's"
    finally:
        sleeper.kill()
        sleeper.communicate()
    stopped = Standing(True, "all-reduce", "train.py:50 in _run_batch", 2391)
    text = describe({0: stopped}, {0: 16.0}, {1: 16.2}, ["default group: rank 0 in all_reduce #2398 (84 B)"], {1: "stopped by SIGSTOP"})
    assert text == (
        "rank 0 waits in all-reduce at train.py:50 in _run_batch, after step 2391; "
        "rank 1 sent nothing for 16 s (stopped by SIGSTOP); default group: rank 0 in all_reduce #2398 (84 B)"
    )


@pytest.mark.parametrize(("slow", "where"), [(2, "compute"), (1, "data")])
def test_a_straggler_is_told_by_ddps_sampled_compute_and_its_own_data_wait(slow, where):
    """Every rank's step takes as long; DDP times the same iterations on each (here one in
    ten), and the straggler's compute, or its wait for its data, is its own."""
    dog, state, clock = make(world=4)
    for n in range(60):
        for rank in range(4):
            data = 20.0 if rank == slow and where == "data" else 1.0
            compute = 25.0 if rank == slow and where == "compute" else 10.0
            sampled = {"compute_ms": compute, "comm_ms": 30.0 - compute - data, "comm_step": n} if n % 10 == 0 else {}
            feed(dog, state, {**step(rank, n), "step_ms": 31.0, "data_ms": data, **sampled})
    assert [v.ranks for v in seconds(dog, clock, 5) if v.kind == "straggler"] == [[slow]]


def test_neither_a_warm_up_nor_one_unlucky_sampled_iteration_nor_a_tiny_data_wait_is_a_straggler():
    """DDP samples iterations 1-10, then every 100th: rank 3's first backward and one
    descheduled iteration are single samples; rank 0's data wait is twice the others' and
    costs nobody anything. Slow on most of its last three samples, rank 3 is one."""
    dog, state, clock = make(world=4)

    def run(steps: range, slow: set[int]) -> list[list[int]]:
        told = []
        for n in steps:
            for rank in range(4):
                sampled = n < 10 or n % 100 == 0
                compute = 80.0 if rank == 3 and (n in slow or n == 0) else 10.0
                data = 0.04 if rank == 0 else 0.02
                extra = {"compute_ms": compute, "comm_ms": 1.0, "comm_step": n} if sampled else {}
                feed(dog, state, {**step(rank, n), "step_ms": 30.0, "data_ms": data, **extra})
            if n % 10 == 9:  # 30 ms steps: a tick every 0.3 s
                clock.now += 0.3
                told += [(n, v.ranks) for v in dog.tick() if v.kind == "straggler"]
        return told

    assert run(range(0, 500), slow={200}) == []
    # Its second slow sample makes the median of three, at step 700; then 3 s over, 100 steps.
    assert run(range(500, 900), slow={600, 700, 800}) == [(819, [3])]


def stall_while_ranks_0_and_1_wait(dog: Watchdog, state: JobState, clock: Clock) -> Verdict:
    """The one stall verdict while ranks 0 and 1 wait in step 30's all-reduce, heard every second."""
    verdicts = []
    for _ in range(int(STALL_MIN_S) + 2):
        clock.now += 1.0
        for rank in (0, 1):
            feed(dog, state, beat(rank, 30, "all-reduce", where="train.py:51 in train_step"))
        verdicts += [v for v in dog.tick() if v.kind == "stall"]
    [stall] = verdicts
    return stall


def test_a_rank_of_the_world_never_heard_from_is_named_in_the_stall():
    """Rank 2 stopped (or held the GIL) before its first word reached the supervisor: its peers
    wait for it in the all-reduce, and only the world size its peers told says it exists."""
    state, clock = JobState(), Clock()
    dog = Watchdog(WatchPolicy(), state, lambda failure: LogTail([]), clock)
    for rank in (0, 1):
        feed(dog, state, hello(rank, world=3))
    stepping(2, 30, clock, dog, state)
    stall = stall_while_ranks_0_and_1_wait(dog, state, clock)
    assert stall.text.endswith("; rank 2 never heard from in this attempt"), stall.text
    feed(dog, state, hello(2, world=3))
    assert dog.liveness.unheard() == []
    feed(dog, state, hello(0, restart=1, world=2))  # a smaller world in the next attempt
    assert dog.liveness.unheard() == [1]


def test_a_rank_that_went_quiet_is_described_once_not_again_in_its_group_s_collective():
    """Rank 2 stopped (SIGSTOP) in step 30's backward while ranks 0,1 wait in its all-reduce: the
    stall says once where it was and for how long, and the collective's clause names those inside."""
    dog, state, clock = make(world=3)
    stepping(3, 30, clock, dog, state)
    feed(dog, state, beat(2, 30, "backward", where="train.py:1318 in _backward"))
    stall = stall_while_ranks_0_and_1_wait(dog, state, clock)
    assert stall.text.endswith(
        "rank 2 stuck 15 s in backward at train.py:1318 in _backward, after step 29; default group: ranks 0,1 in all_reduce #31 (25.0 MiB)"
    ), stall.text


def stall_once_rank_0_ended(rank_1: dict) -> str:
    """The stall's text where rank 0 of 2 exited without error after step 29 and rank 1 then sat
    still in what its heartbeat (rank_1) tells."""
    dog, state, clock = make(world=2)
    stepping(2, 30, clock, dog, state)
    feed(dog, state, beat(0, 30, "exit"))
    feed(dog, state, {"type": "rank_gone", "rank": 0, "wall": 0.0})
    verdicts = []
    for _ in range(int(STALL_MIN_S) + 2):
        clock.now += 1.0
        feed(dog, state, rank_1)
        verdicts += [v for v in dog.tick() if v.kind == "stall"]
    [stall] = verdicts
    return stall.text


def test_a_rank_that_ended_while_the_others_trained_on_is_named_in_the_stall():
    """Rank 0 ran out of batches after step 29 and exited without error; rank 1, given more, waits
    on NCCL in step 30's all-reduce that rank 0 never joins. The stall said nothing of rank 0:
    gone ranks are not stuck ones. A rank that waits in its shutdown, or in a last barrier after
    its loop, was not left by uneven inputs."""
    text = stall_once_rank_0_ended(beat(1, 30, "all-reduce", where="train.py:51 in train_step"))
    assert text.endswith(
        "; rank 0 had exited without error after step 29 while the others trained on: "
        "the ranks ran unequal numbers of steps (uneven inputs: DDP's Join evens them out)"
    ), text
    for after_loop in (beat(1, 30, "exit"), beat(1, 30, "data", inside="barrier")):
        text = stall_once_rank_0_ended(after_loop)
        assert text.endswith("; rank 0 had exited without error after step 29"), text
