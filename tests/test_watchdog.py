"""The watchdog's rules, fed plain records on a clock the test moves."""

from __future__ import annotations

import builders
import pytest

from ddptop.core.model.job import JobState
from ddptop.core.policy import Started, WatchPolicy
from ddptop.supervisor.watching.failures import LogTail, crash_excerpt, last_error_line, script_frame
from ddptop.supervisor.watching.rules import nan
from ddptop.supervisor.watching.rules.crash import OOM_KILLED
from ddptop.supervisor.watching.rules.hang import STARTUP_GRACE_S
from ddptop.supervisor.watching.rules.per_step import GATHER_S
from ddptop.supervisor.watching.verdict import Verdict
from ddptop.supervisor.watching.watchdog import Watchdog
from ddptop.trainer import runtime


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hello(rank: int, restart: int = 0, world: int = 4) -> dict:
    return builders.hello(rank, world, restart=restart)


step = builders.step


def failure(rank: int, code: int, restart: int = 0, pid: int | None = None, local_rank: int | None = None, node: int = 0) -> dict:
    """torchrun's probe reporting a worker that failed (pid and local rank default to hello's)."""
    return {
        "type": "worker_failure",
        "node": node,
        "restart": restart,
        "rank": rank,
        "local_rank": rank if local_rank is None else local_rank,
        "pid": 100 + rank if pid is None else pid,
        "exitcode": code,
        "wall": 0.0,
    }


def make(
    policy: WatchPolicy | None = None, world: int = 4, log: list[str] | None = None, written: float | None = None
) -> tuple[Watchdog, JobState, Clock]:
    state, clock = JobState(), Clock()
    dog = Watchdog(policy or WatchPolicy(), state, lambda failure: LogTail(log or [], written), clock)
    for rank in range(world):
        feed(dog, state, hello(rank, world=world))
    return dog, state, clock


def feed(dog: Watchdog, state: JobState, record: dict) -> list:
    state.ingest(record)
    return dog.observe(record)


def seconds(dog: Watchdog, clock: Clock, count: int) -> list[Verdict]:
    """A tick a second for count seconds, the first now: what they decided."""
    verdicts = []
    for n in range(count):
        clock.now += n and 1.0
        verdicts += dog.tick()
    return verdicts


def test_nan_verdict_waits_for_every_rank_and_names_the_source():
    dog, state, _ = make()
    verdicts = []
    for rank in range(4):
        verdicts += feed(dog, state, step(rank, 15, nonfinite=True, local_nonfinite=rank == 2, skipped="nan"))
        if rank < 3:
            assert verdicts == []
    [v] = verdicts
    assert (v.kind, v.step, v.ranks, v.action) == ("nan", 15, [2], "none")
    assert nan.OWN_LOSS.format(ranks="rank 2") in v.text and nan.SKIPPED_ALL in v.text


@pytest.mark.parametrize("policy, action", [("stop", "stop"), ("restart", "restart"), ("warn", "none")])
def test_nan_policy_becomes_the_action(policy, action):
    dog, state, _ = make(WatchPolicy(on_nan=policy), world=1)
    [v] = feed(dog, state, step(0, 3, nonfinite=True, local_nonfinite=True))
    assert v.action == action


def test_a_nan_step_that_cuda_ranks_applied_says_so_and_how_to_skip_it():
    dog, state, _ = make(world=2)
    verdicts = [v for rank in (0, 1) for v in feed(dog, state, step(rank, 8, nonfinite=True, local_nonfinite=rank == 0))]
    [v] = verdicts
    assert (v.action, v.ranks) == ("none", [0])
    assert nan.APPLIED_LATE in v.text and "--on-nan skip" in v.text and nan.SKIPPED not in v.text


@pytest.mark.parametrize("policy, then", [("auto", ""), ("skip", ""), ("restart", nan.THEN["restart"])])
def test_a_nan_step_of_sharded_gradients_says_why_it_was_applied_whatever_the_policy(policy, then):
    """Ranks whose shards went non-finite cannot skip alone: the alert must not say --on-nan skip would skip it."""
    dog, state, _ = make(WatchPolicy(on_nan=policy), world=2)
    verdicts = [v for rank in (0, 1) for v in feed(dog, state, step(rank, 8, nonfinite=True, local_nonfinite=False, sharded=True))]
    [v] = verdicts
    assert v.text.endswith(nan.APPLIED_SHARDED + then), v.text


def test_consecutive_non_finite_steps_are_one_alert_told_again_at_the_10th_and_100th():
    """Weights a NaN reached stay NaN: every step after is non-finite, and an alert a step
    would bury the first (the cause) under thousands."""
    dog, state, _ = make(world=1)
    told = [v.text for n in range(5, 130) for v in feed(dog, state, step(0, n, nonfinite=True, local_nonfinite=True))]
    assert [text.split(":")[0] for text in told] == [f"non-finite loss or gradients at step {n}" for n in (5, 14, 104)]
    assert told[1].endswith(nan.IN_A_ROW.format(count=10, first=5)) and told[2].endswith(nan.IN_A_ROW.format(count=100, first=5))
    assert len(feed(dog, state, step(0, 131, nonfinite=True, local_nonfinite=True))) == 1, "a finite step between: a new run"


def test_nan_verdict_goes_without_a_silent_rank_after_the_gather_time():
    dog, state, clock = make(world=2)
    assert feed(dog, state, step(0, 4, nonfinite=True, local_nonfinite=False)) == []
    clock.now += GATHER_S + 0.1
    [v] = dog.tick()
    assert v.ranks == [] and nan.FINITE_LOSSES in v.text


def test_desync_names_the_minority_once_per_divergence():
    dog, state, _ = make(WatchPolicy(on_desync="restart"))
    sums = {0: 7, 1: 7, 2: 7, 3: 9}
    verdicts = [v for r, c in sums.items() for v in feed(dog, state, step(r, 10, checksum=c))]
    [v] = verdicts
    assert (v.kind, v.ranks, v.step, v.action) == ("desync", [3], 10, "restart")
    assert "0000000000000009" in v.text and v.details["checksums"]["0"] == "0000000000000007"
    again = [v for r, c in sums.items() for v in feed(dog, state, step(r, 20, checksum=c))]
    assert again == []


def test_desync_without_majority_names_every_rank():
    dog, state, _ = make(world=2)
    verdicts = feed(dog, state, step(0, 0, checksum=1)) + feed(dog, state, step(1, 0, checksum=2))
    assert verdicts[0].ranks == [0, 1] and "no majority" in verdicts[0].text


def test_desync_compares_each_rank_with_its_ddp_replicas_alone():
    """Two pipeline stages, each replicated by DDP over its own group ({0,2} and {1,3}): the stages'
    parameters differ by design, so only a replica that drifts from its group's is named."""
    dog, state, _ = make(WatchPolicy(on_desync="restart"))
    groups = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    stages = {0: 7, 1: 9, 2: 7, 3: 9}
    assert [v for r, c in stages.items() for v in feed(dog, state, step(r, 0, checksum=c, replicas=groups[r]))] == []
    drifted = {**stages, 2: 8}
    [v] = [v for r, c in drifted.items() for v in feed(dog, state, step(r, 10, checksum=c, replicas=groups[r]))]
    assert (v.kind, v.ranks, v.step, v.action) == ("desync", [0, 2], 10, "restart")
    assert (
        v.text
        == "parameters differ at step 10 between the data-parallel ranks 0,2, no majority: rank 0 0000000000000007, rank 2 0000000000000008"
    )
    assert set(v.details["checksums"]) == {"0", "2"}
    assert [v for r, c in drifted.items() for v in feed(dog, state, step(r, 20, checksum=c, replicas=groups[r]))] == []


def test_a_non_finite_step_on_part_of_the_job_names_the_ranks_that_skipped_it():
    """Ranks 0 and 2 (a stage's replicas) skip a non-finite step; ranks 1 and 3 had finite
    gradients and stepped: the alert must not say every rank skipped."""
    dog, state, clock = make()
    assert [v for r in (0, 2) for v in feed(dog, state, step(r, 6, nonfinite=True, local_nonfinite=False, skipped="nan"))] == []
    clock.now += GATHER_S + 0.1
    [v] = dog.tick()
    assert v.text.endswith(nan.SKIPPED_ON.format(ranks="ranks 0,2")), v.text


def test_equal_checksums_raise_nothing():
    dog, state, _ = make()
    assert [v for r in range(4) for v in feed(dog, state, step(r, 0, checksum=5))] == []


def waiting(rank: int, step: int, entered: bool = True) -> dict:
    """A heartbeat from a rank in its backward, its flight recorder telling that it entered
    the step's all-reduce (#step + 1) and has not completed it, or never entered it."""
    collective = {"group": "0", "name": "default group", "enqueued": step + entered, "completed": step, "op": "all_reduce"}
    return {"type": "heartbeat", "rank": rank, "wall": 0.0, "phase": "backward", "step": step, "dropped": 0, "collectives": [collective]}


def test_hang_groups_ranks_by_phase_and_asks_for_stacks():
    dog, state, clock = make(WatchPolicy(hang_timeout=10))
    for rank in range(4):
        feed(dog, state, step(rank, 19))
        feed(dog, state, waiting(rank, 20, entered=rank != 2))
    clock.now += 9.9
    assert dog.tick() == []
    for rank in range(4):
        feed(dog, state, waiting(rank, 20, entered=rank != 2))
    clock.now += 0.2
    [v] = dog.tick()
    assert v.kind == "hang" and v.action == "restart" and v.stacks == [0, 1, 2, 3]
    assert v.text == (
        "no step for 10 s: ranks 0,1,3 wait in all-reduce, after step 19; rank 2 stuck 10 s in backward, after step 19; "
        "default group: ranks 0,1,3 in all_reduce #21; rank 2 never entered it, its last: all_reduce #20"
    )
    assert dog.tick() == []  # one alert per hang


def test_hang_names_a_rank_whose_last_step_came_a_moment_after_the_others():
    dog, state, clock = make(WatchPolicy(hang_timeout=10), world=3)
    feed(dog, state, step(0, 5))
    feed(dog, state, step(1, 5))
    clock.now += 3
    feed(dog, state, step(2, 5))  # it finished step 5 later, and is just as stuck
    clock.now += 4
    feed(dog, state, step(0, 6))  # rank 0 is not stuck: it still steps
    for rank in range(3):
        feed(dog, state, waiting(rank, 6))
    clock.now += 3.1
    [v] = dog.tick()
    assert v.ranks == [1, 2] and "ranks 1,2 wait in all-reduce" in v.text


def test_hang_names_silent_ranks_and_gives_startup_its_grace():
    dog, state, clock = make(WatchPolicy(hang_timeout=10, on_hang="stop"), world=2)
    clock.now += 11
    assert dog.tick() == []  # no step yet: startup has STARTUP_GRACE_S
    feed(dog, state, step(0, 0))
    feed(dog, state, step(1, 0))
    clock.now += 11
    [v] = dog.tick()
    assert v.action == "stop" and "ranks 0,1 sent nothing for 11 s" in v.text
    clock.now += STARTUP_GRACE_S
    feed(dog, state, hello(0, restart=1, world=2))
    feed(dog, state, {"type": "rank_gone", "rank": 1, "wall": 0.0})
    assert dog.tick() == []  # a new attempt starts with a clean slate


def test_crash_picks_the_first_rank_to_go_and_ignores_deaths_we_caused():
    log = [
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x1 (most recent call first):",
        '  File "train.py", line 9 in step',
        "",
        "Extension modules: torch._C",
    ]
    dog, state, clock = make(log=log)
    dog.expect_deaths({103})
    feed(dog, state, {"type": "rank_gone", "rank": 2, "wall": 0.0})
    clock.now += 0.01
    feed(dog, state, {"type": "rank_gone", "rank": 0, "wall": 0.0})
    for rank, code, pid in ((0, 1, 100), (2, -11, 102), (3, -9, 103)):
        feed(dog, state, failure(rank, code, pid=pid))
    assert dog.tick() == []  # gathering the failures of one poll
    clock.now += 0.5
    [v] = dog.tick()
    assert v.kind == "crash" and v.ranks == [2] and v.details["exitcode"] == -11
    assert "rank 2 was killed by SIGSEGV before its first step" in v.text
    assert 'Segmentation fault in File "train.py", line 9 in step' in v.text and "(rank 0 failed after it)" in v.text


@pytest.mark.parametrize(
    "written, said", [(-40.0, "its last output, 40 s before it died: "), (-2.0, "its log ends: "), (None, "its log ends: ")]
)
def test_a_killed_rank_s_last_output_is_quoted_with_its_age_when_it_is_old(written, said):
    """A rank SIGKILLed at step 900 left no words of its own: its stderr ends with a warning from
    its start-up, which is not why it died, and the verdict says how old it is."""
    warning = "train.py:80: FutureWarning: `broadcast_buffers` is deprecated."
    dog, state, clock = make(world=2, log=[warning, "  model = DDP(model, broadcast_buffers=False)"], written=written)
    feed(dog, state, failure(1, -9))
    clock.now += 0.5
    [v] = dog.tick()
    assert v.text.endswith(f"; {said}{warning}"), v.text


def test_a_rank_killed_by_a_signal_is_the_cause_even_when_its_peers_seemed_to_go_first():
    """A starved supervisor may see the consequences' sockets close first; a SIGKILL is never a consequence."""
    dog, state, clock = make()
    for rank in (1, 2, 0):
        feed(dog, state, {"type": "rank_gone", "rank": rank, "wall": 0.0})
        clock.now += 0.001
    for rank, code in ((1, 1), (2, -15), (0, -9)):
        feed(dog, state, failure(rank, code))
    clock.now += 0.5
    [v] = dog.tick()
    assert v.ranks == [0] and v.text.startswith("rank 0 was killed by SIGKILL")


def test_a_rank_that_exited_on_its_own_is_named_before_one_torchrun_stopped():
    """Rank 1 exits 2 at once; torchrun SIGTERMs rank 0, which had printed the
    usage error and happened to close its connection first."""
    dog, state, clock = make(world=2, log=["train.py: error: bad --inject"])
    feed(dog, state, {"type": "rank_gone", "rank": 0, "wall": 0.0})
    clock.now += 0.01
    feed(dog, state, {"type": "rank_gone", "rank": 1, "wall": 0.0})
    for rank, code in ((0, -15), (1, 2)):
        feed(dog, state, failure(rank, code))
    clock.now += 0.5
    [v] = dog.tick()
    assert v.ranks == [1] and v.details["exitcode"] == 2, v.text


def test_failures_later_in_the_same_attempt_are_consequences_not_a_second_crash():
    """Across nodes the other node's ranks fail of the broken collective a moment later."""
    dog, state, clock = make()
    first = failure(2, -9, local_rank=0, node=1)
    feed(dog, state, first)
    clock.now += 0.5
    [crash] = dog.tick()
    assert crash.ranks == [2]
    for rank in (0, 1):
        feed(dog, state, failure(rank, 1))
    clock.now += 0.5
    assert dog.tick() == []
    # The next attempt's failures count again, even one that comes before its
    # rank's hello (they travel on different connections).
    feed(dog, state, {**first, "restart": 1, "rank": 0, "pid": 200, "exitcode": 1})
    clock.now += 0.5
    assert [v.ranks for v in dog.tick()] == [[0]]


def test_a_rank_the_oom_killer_killed_is_said_to_have_run_out_of_memory():
    """torchrun's probe counted an OOM kill in the attempt: a rank SIGKILLed, or a rank whose
    DataLoader worker was, and which then raised. Without a count, nothing is said of memory."""
    dog, state, _ = make(world=2)
    feed(dog, state, {**failure(1, -9), "oom_kills": 1})
    feed(dog, state, {**failure(0, 1), "oom_kills": 1})
    [v, *_] = dog.tick(final=True)
    assert v.text == "rank 1 was killed by SIGKILL before its first step (rank 0 failed after it)" + OOM_KILLED.format(
        count="a process", node=0
    )
    dog, state, _ = make(world=1)
    worker = "Traceback...\nRuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.\n"
    feed(dog, state, {"type": "exception", "rank": 0, "wall": 0.0, "text": worker})
    feed(dog, state, {**failure(0, 1), "oom_kills": 2})
    [v, *_] = dog.tick(final=True)
    assert v.text.endswith("is killed by signal: Killed." + OOM_KILLED.format(count="2 processes", node=0)), v.text
    dog, state, _ = make(world=1)
    feed(dog, state, failure(0, -9))
    [v, *_] = dog.tick(final=True)
    assert "memory" not in v.text


def test_a_spawned_rank_that_was_killed_is_named_though_another_raised_when_it_went():
    """mp.spawn: rank 1 is SIGKILLed, rank 0 raises in the broken collective, and the
    spawning parent (torchrun's only worker) fails naming process 1."""
    dog, state, _ = make(WatchPolicy(started=Started(style="spawn")), world=2)
    feed(dog, state, {"type": "exception", "rank": 0, "wall": 0.0, "text": "Traceback...\nRuntimeError: Connection closed by peer\n"})
    spawner_said = "Traceback...\ntorch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL"
    feed(dog, state, {**failure(0, 1, pid=999), "message": spawner_said})
    [v, *_] = dog.tick(final=True)
    assert v.kind == "crash" and v.ranks == [1] and v.text.startswith("rank 1 was killed by SIGKILL"), v.text


def test_a_spawned_rank_s_death_is_read_from_the_spawners_log_whatever_its_last_line():
    """No error file: the spawner's stderr (its children's too) holds the report, not always last."""
    log = [
        "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL",
        "  /venv/ddptop/trainer/hooks.py(419): done",  # rank 0's noise, interleaved after it
    ]
    dog, state, _ = make(WatchPolicy(started=Started(style="spawn")), world=2, log=log)
    feed(dog, state, failure(0, 1, pid=999))
    [v, *_] = dog.tick(final=True)
    assert v.ranks == [1] and v.text.startswith("rank 1 was killed by SIGKILL"), v.text


def test_crash_quotes_the_ranks_own_exception():
    dog, state, _ = make(world=1)
    feed(dog, state, step(0, 4))
    feed(dog, state, {"type": "heartbeat", "rank": 0, "wall": 0.0, "phase": "data", "step": 5, "dropped": 0})
    feed(dog, state, {"type": "exception", "rank": 0, "wall": 0.0, "text": "Traceback...\nValueError: bad batch\n", "phase": "data"})
    feed(dog, state, failure(0, 1))
    [v] = dog.tick(final=True)
    assert v.text == "rank 0 failed with exit code 1 after step 4 (in data): ValueError: bad batch"


def test_a_killed_rank_is_said_last_seen_in_a_phase_only_if_its_last_heartbeat_was_in_the_step_it_died_in():
    """The OOM killer's SIGKILL leaves no exception, only the phase of the last heartbeat, up to a
    second old: with 2 ms steps that was some forty steps before, in a phase it had long left."""
    for heartbeat_step, said in ((20, "after step 50"), (51, "after step 50 (last seen in backward)")):
        dog, state, _ = make(world=1)
        feed(dog, state, {"type": "heartbeat", "rank": 0, "wall": 0.0, "phase": "backward", "step": heartbeat_step, "dropped": 0})
        for n in range(51):
            feed(dog, state, step(0, n))
        feed(dog, state, failure(0, -9))
        [v] = dog.tick(final=True)
        assert v.text == "rank 0 was killed by SIGKILL " + said, v.text


def test_a_rank_that_exited_of_itself_mid_job_is_said_last_seen_shutting_down():
    """sys.exit(3) in the script runs the interpreter's shutdown, where the rank's last heartbeat
    told phase "exit": the text said "(last seen in exit)"."""
    dog, state, _ = make(world=1)
    for n in range(51):
        feed(dog, state, step(0, n))
    feed(dog, state, {"type": "heartbeat", "rank": 0, "wall": 0.0, "phase": "exit", "step": 51, "dropped": 0})
    feed(dog, state, failure(0, 3))
    [v] = dog.tick(final=True)
    assert v.text.startswith("rank 0 failed with exit code 3 after step 50 (last seen shutting down)"), v.text


def test_a_rank_that_failed_in_a_collective_a_rank_that_had_ended_never_joined_names_that_rank():
    """Uneven inputs on gloo: rank 0 finished its 100 batches and exited without error; rank 1,
    given more, failed in step 100's all-reduce ("Connection closed by peer"), blamed alone. The
    same failure in the ranks' shutdown, after both trained to the end, says no more than that."""
    for phase, said in (("backward", " while the others trained on: the ranks ran unequal numbers of steps"), ("exit", "")):
        dog, state, clock = make(world=2)
        for n in range(100):
            for rank in (0, 1):
                feed(dog, state, step(rank, n))
        feed(dog, state, {"type": "heartbeat", "rank": 0, "wall": 0.0, "phase": "exit", "step": 100, "dropped": 0})
        feed(dog, state, {"type": "rank_gone", "rank": 0, "wall": 0.0})
        clock.now += 0.8  # rank 1 waited in the all-reduce until gloo saw rank 0's connection close
        error = "Traceback...\nRuntimeError: Connection closed by peer [127.0.0.1]:6022\n"
        feed(dog, state, {"type": "exception", "rank": 1, "wall": 0.0, "text": error, "phase": phase})
        feed(dog, state, {"type": "rank_gone", "rank": 1, "wall": 0.0})
        feed(dog, state, failure(1, 1))
        [v] = dog.tick(final=True)
        assert v.text.startswith("rank 1 failed with exit code 1 after step 99"), v.text
        uneven = " (uneven inputs: DDP's Join evens them out)" if said else ""
        assert v.text.endswith("; rank 0 had exited without error after step 99" + said + uneven), v.text


DDP_UNUSED = """Traceback (most recent call last):
  File "/job/train.py", line 16, in <module>
    loss = nn.functional.cross_entropy(m(x), y)
                                       ^^^^
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1775, in _pre_forward
    if torch.is_grad_enabled() and self.reducer._rebuild_buckets():
                                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.
making sure all `forward` function outputs participate in calculating loss.
Parameter indices which did not receive grad for rank 0: 4 5
 In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL
"""


def test_a_crash_quotes_the_line_that_names_the_exception_and_the_phase_it_was_raised_in():
    """DDP's error goes on for lines of hints below the line that says what went wrong; and
    once the rank raised, its heartbeats say it is exiting, not where it failed."""
    dog, state, _ = make(world=1)
    feed(dog, state, step(0, 0))
    feed(dog, state, {"type": "exception", "rank": 0, "wall": 0.0, "text": DDP_UNUSED, "phase": "forward"})
    feed(dog, state, {"type": "heartbeat", "rank": 0, "wall": 0.0, "phase": "exit", "step": 1, "dropped": 0})
    feed(dog, state, failure(0, 1))
    [v] = dog.tick(final=True)
    assert v.text == (
        "rank 0 failed with exit code 1 after step 0 (in forward): RuntimeError: Expected to have finished "
        "reduction in the prior iteration before starting a new one. at train.py:16 in <module>"
    ), v.text


def test_a_crash_whose_message_runs_to_thousands_of_lines_quotes_its_first():
    """torch's "Could not run 'aten::...' with arguments from the 'SparseCPU' backend" goes on
    with a line for each of its dispatcher's backends, past what a rank sends of a traceback:
    the frames and the message's first line must be what is kept, not its last lines."""
    backends = "".join(f"\nBackend{i}: registered at /__w/pytorch/aten/src/kernel.cpp:{i} [kernel]" for i in range(400))

    def forward() -> None:
        raise NotImplementedError("Could not run 'aten::linalg_vector_norm' with arguments from the 'SparseCPU' backend." + backends)

    try:
        forward()
    except NotImplementedError as error:
        text = runtime.traceback_text(error)
    assert len(text) <= runtime.TRACEBACK_MAX
    dog, state, _ = make(world=1)
    feed(dog, state, {"type": "exception", "rank": 0, "wall": 0.0, "text": text, "phase": "optimizer"})
    feed(dog, state, failure(0, 1))
    [v] = dog.tick(final=True)
    assert ": NotImplementedError: Could not run 'aten::linalg_vector_norm' with arguments from the 'SparseCPU' backend. at" in v.text, (
        v.text
    )


def test_a_traceback_in_a_rank_s_log_is_read_for_its_exception_torchrun_s_prefixes_and_all():
    log = [f"[rank0]:{' ' if line and not line[0].isspace() else ''}{line}" for line in DDP_UNUSED.splitlines()]
    assert last_error_line(log).startswith("RuntimeError: Expected to have finished reduction"), last_error_line(log)
    cut = ["RuntimeError: a message", "with a second line"]  # the frames cut away: the last words
    assert last_error_line(cut) == "with a second line"


def test_a_crash_is_read_from_the_log_of_the_attempt_that_failed_before_its_hello_arrived():
    """The failure (torchrun's probe) and the rank's hello travel on different
    connections: a usage error in the third attempt is read from that
    attempt's log even while the rank's last hello read is the first's."""
    logs = {(0, 2): ["usage: train.py", "train.py: error: bad --inject"], (0, 0): ["started"]}
    state, clock = JobState(), Clock()
    dog = Watchdog(WatchPolicy(), state, lambda failure: LogTail(logs.get((failure["local_rank"], failure["restart"]), [])), clock)
    feed(dog, state, hello(0, restart=0, world=1))
    feed(dog, state, failure(0, 2, restart=2, pid=300))
    clock.now += 0.5
    [crash] = dog.tick()
    assert crash.text.endswith("its log ends: train.py: error: bad --inject"), crash.text


def crash_once(
    dog: Watchdog, state: JobState, clock: Clock, restart: int, message: str, code: int = 1, rank: int = 0, progress: bool = True
) -> list:
    """One attempt of a 1-rank group that dies with `message` (without a word
    if empty), after a step (progress) or before its first; the verdicts it brings."""
    feed(dog, state, hello(0, restart=restart, world=1))
    if progress:
        feed(dog, state, step(0, 0))
    if message:
        feed(dog, state, {"type": "exception", "rank": 0, "wall": 0.0, "text": f"Traceback...\n{message}\n"})
    feed(
        dog,
        state,
        failure(rank, code, restart=restart, pid=100, local_rank=0),
    )
    clock.now += 1.0
    return dog.tick()


def test_the_same_failure_three_times_in_the_window_is_a_crash_loop():
    dog, state, clock = make(WatchPolicy(crash_loop=3, crash_loop_window=60), world=1)
    assert [v.kind for v in crash_once(dog, state, clock, 0, "RuntimeError: out of memory at 0x7f01")] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 1, "ValueError: something else")] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 2, "RuntimeError: out of memory at 0x7f99")] == ["crash"]
    _crash, loop = crash_once(dog, state, clock, 3, "RuntimeError: out of memory at 0x7faa")
    assert (loop.kind, loop.action, loop.details["exit_status"]) == ("crash-loop", "stop", 1)
    assert loop.text.startswith("the same failure 3 times in 3 s, stopping the job: rank 0 failed with exit code 1")
    assert loop.text.endswith("RuntimeError: out of memory at 0x7faa")


def test_a_failure_that_left_no_words_is_alike_to_any_of_its_exit_status():
    """Rank 0 prints a usage error, but in some attempts silent rank 1 exits
    first and torchrun stops rank 0 before it speaks: still the same failure."""
    dog, state, clock = make(WatchPolicy(crash_loop=3, crash_loop_window=60), world=1)
    assert [v.kind for v in crash_once(dog, state, clock, 0, "train.py: error: bad --inject", code=2)] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 1, "", code=2)] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 2, "", code=2)] == ["crash", "crash-loop"]


def test_failures_with_different_words_are_not_alike_even_with_silent_ones_between():
    dog, state, clock = make(WatchPolicy(crash_loop=3, crash_loop_window=60), world=1)
    crash_once(dog, state, clock, 0, "ValueError: a", code=1)
    crash_once(dog, state, clock, 1, "KeyError: b", code=1)
    assert [v.kind for v in crash_once(dog, state, clock, 2, "ValueError: a", code=1)] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 3, "", code=2)] == ["crash"]  # another exit status


def test_failures_spread_wider_than_the_window_are_no_loop():
    dog, state, clock = make(WatchPolicy(crash_loop=2, crash_loop_window=60), world=1)
    crash_once(dog, state, clock, 0, "", code=-9)
    clock.now += 120
    assert [v.kind for v in crash_once(dog, state, clock, 1, "", code=-9)] == ["crash"]
    _, loop = crash_once(dog, state, clock, 2, "", code=-9)
    assert loop.kind == "crash-loop" and loop.details["exit_status"] == 137


def test_straggler_needs_a_sustained_ratio():
    dog, state, clock = make(world=4)
    for n in range(20):
        for rank in range(4):
            busy = 50.0 if rank == 1 else 10.0
            feed(dog, state, {**step(rank, n), "step_ms": 60.0, "data_ms": 0.0, "compute_ms": busy, "comm_ms": 60.0 - busy})
    assert seconds(dog, clock, 3) == []  # over for 2 s
    clock.now += 1.0
    [v] = dog.tick()
    assert v.kind == "straggler" and v.ranks == [1] and v.details["ratio"] == 5.0
    assert "(50.0 ms vs 10.0 ms)" in v.text, "in tenths, as the table has them: a fast job's median read '0 ms'"
    # Its forward and backward set it apart, not its data: a slower GPU, or more work, not its loader.
    assert v.details["cause"] == "compute" and "slow in its compute: 50.0 ms a step of forward and backward, against 10.0;" in v.text
    assert seconds(dog, clock, 5) == []  # told once


def test_an_hsdp_straggler_s_verdict_says_where_each_other_rank_waits_for_it():
    """HSDP 2x2 (replicas {0,2} and {1,3}, shards {0,1} and {2,3}): rank 3 is slow in its
    compute. Its shard partner, rank 2, waits in the all-gathers within their replica; ranks 0
    and 1 in the all-reduce across replicas, as their timed steps' comm by mesh dimension says
    (trainer/collective_timer.py)."""
    dog, state, clock = make(world=4)
    within = {"shard": {"all-gather": 60.0, "reduce-scatter": 5.0}, "replicate": {"all-reduce": 10.0}}
    across = {"shard": {"all-gather": 10.0, "reduce-scatter": 5.0}, "replicate": {"all-reduce": 60.0}}
    quiet = {"shard": {"all-gather": 2.0, "reduce-scatter": 1.0}, "replicate": {"all-reduce": 2.0}}
    for n in range(20):
        for rank in range(4):
            dims = {0: across, 1: across, 2: within, 3: quiet}[rank]
            busy = 80.0 if rank == 3 else 20.0
            comm = sum(sum(ops.values()) for ops in dims.values())
            record = {**step(rank, n), "step_ms": 100.0, "data_ms": 0.0, "compute_ms": busy, "comm_ms": comm, "comm_dims": dims}
            feed(dog, state, {**record, "sharded": True})
    assert seconds(dog, clock, 3) == []
    clock.now += 1.0
    [v] = dog.tick()
    assert v.kind == "straggler" and v.ranks == [3] and v.details["cause"] == "compute", v.text
    assert v.text.endswith(
        "the other ranks wait for it: ranks 0,1 in the all-reduces over replicate, rank 2 in the all-gathers over shard"
    ), v.text


def test_a_pipeline_stage_is_set_against_its_own_replicas_not_the_other_stages():
    """Four pipeline stages, each replicated by DDP over three ranks ({s, s+4, s+8}): the last
    stage waits 40 ms a step for its activations, which reads as its data wait, and it is no
    straggler for that. Rank 11 then takes 100 ms where its replicas take 40: it is one."""
    dog, state, clock = make(world=12)
    for rank in range(12):
        replicas = [rank % 4, rank % 4 + 4, rank % 4 + 8]
        feed(dog, state, {"type": "heartbeat", "rank": rank, "wall": 0.0, "phase": "data", "step": 0, "dropped": 0, "replicas": replicas})

    def steps(first: int, count: int, slow: float) -> None:
        for n in range(first, first + count):
            for rank in range(12):
                data = (slow if rank == 11 else 40.0) if rank % 4 == 3 else 2.0
                feed(dog, state, {**step(rank, n), "step_ms": 120.0, "data_ms": data})

    steps(0, 20, slow=40.0)
    assert state.lags()[7].ratio == pytest.approx(1.0)
    assert seconds(dog, clock, 6) == []
    steps(20, 60, slow=100.0)  # the window's median is the slow steps'
    assert seconds(dog, clock, 3) == []
    clock.now += 1.0
    [v] = dog.tick()
    assert v.kind == "straggler" and v.ranks == [11] and v.details["ratio"] == pytest.approx(2.5)
    assert v.details["cause"] == "input", v.text
    assert (
        "the median of its data-parallel ranks 3,7,11 (100.0 ms vs 40.0 ms), slow in its input: it waits 100.0 ms a step "
        "for its data, against 40.0; they wait for it in the all-reduce"
    ) in v.text


def test_last_error_line_falls_back_to_the_last_words():
    assert last_error_line(["a", "b", "  "]) == "b"
    assert last_error_line([]) is None


def test_a_fatal_signal_report_is_kept_from_its_start_less_the_threads_in_no_python_code():
    native = ["Thread 0x00007f86266286c0 (most recent call first):", "  <no Python frame>", ""]
    report = [
        "Fatal Python error: Segmentation fault",
        "",
        *native * 30,
        "Thread 0x00007f8649f486c0 (most recent call first):",
        '  File "sender.py", line 111 in _run',
        "",
        "Current thread 0x00007f864ae55b80 (most recent call first):",
        '  File "train.py", line 172 in step',
        "",
        "Extension modules: torch._C (total: 1)",
    ]
    excerpt = crash_excerpt(["step 9", "injected segv", *report], 20)
    assert excerpt[0] == "Fatal Python error: Segmentation fault"
    assert '  File "train.py", line 172 in step' in excerpt and '  File "sender.py", line 111 in _run' in excerpt
    assert not any("<no Python frame>" in line for line in excerpt)
    assert last_error_line(excerpt) == 'Fatal Python error: Segmentation fault in File "train.py", line 172 in step'
    assert crash_excerpt([f"line {i}" for i in range(50)], 20) == [f"line {i}" for i in range(30, 50)]


def test_a_failure_before_the_first_step_that_repeats_stops_at_once():
    """Loading or setup that failed alike twice will fail again: no third attempt, whatever --crash-loop says."""
    dog, state, clock = make(WatchPolicy(crash_loop=5), world=1)
    error = 'Traceback (most recent call last):\n  File "/work/job/train.py", line 89, in <module>\n    torch.cuda.set_device(0)\nAttributeError: no'
    assert [v.kind for v in crash_once(dog, state, clock, 0, error, progress=False)] == ["crash"]
    crash, stop = crash_once(dog, state, clock, 1, error, progress=False)
    assert crash.text.endswith("AttributeError: no at train.py:89 in <module>")
    assert (stop.kind, stop.action, stop.details["exit_status"]) == ("crash-loop", "stop", 1)
    assert stop.text.startswith("the same failure before the first step in attempts 0 and 1: a restart cannot help, stopping the job")


def test_an_early_failure_is_restarted_when_it_differs_or_after_progress():
    dog, state, clock = make(WatchPolicy(crash_loop=5), world=1)
    assert [v.kind for v in crash_once(dog, state, clock, 0, "OSError: port in use", progress=False)] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 1, "ValueError: bad shard", progress=False)] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 2, "ValueError: bad shard", progress=True)] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 3, "ValueError: bad shard", progress=False)] == ["crash"]


def test_the_frame_named_is_the_script_s_own_not_torch_s():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/home/u/proj/train.py", line 12, in <module>\n'
        '  File "/home/u/proj/data.py", line 43, in batches\n'
        '  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 700, in __next__\n'
        '  File "/usr/lib/python3.11/json/decoder.py", line 337, in decode\n'
        "json.decoder.JSONDecodeError: Expecting value\n"
    )
    assert script_frame(text) == "data.py:43 in batches"
    assert script_frame("ValueError: no traceback") is None


def test_an_early_failure_that_left_no_words_is_alike_to_one_that_did():
    """Which rank speaks before torchrun stops the others varies between attempts (see the crash loop)."""
    dog, state, clock = make(WatchPolicy(crash_loop=5), world=1)
    assert [v.kind for v in crash_once(dog, state, clock, 0, "train.py: error: bad --inject", code=2, progress=False)] == ["crash"]
    assert [v.kind for v in crash_once(dog, state, clock, 1, "", code=2, progress=False)] == ["crash", "crash-loop"]


def test_a_one_node_restart_is_judged_at_once_when_every_rank_of_the_attempt_has_gone():
    """torchrun holds its restart until the failure is judged: on one node, once it restarts the
    group and each rank has closed its connection (its last words sent), there is nothing to gather."""
    dog, state, _clock = make(world=2)
    state.meta = {"nnodes": "1"}
    feed(dog, state, {"type": "rank_gone", "rank": 1, "wall": 0.0})
    for rank, code in ((1, -9), (0, -15)):
        feed(dog, state, failure(rank, code))
    feed(dog, state, {"type": "group_restart", "node": 0, "restart": 1, "remaining": 2, "wall": 0.0})
    assert dog.tick() == []  # rank 0's connection is still open: its words may be on the way
    feed(dog, state, {"type": "rank_gone", "rank": 0, "wall": 0.0})
    [v] = dog.tick()  # no time has passed
    assert v.kind == "crash" and v.ranks == [1]


def test_on_several_nodes_a_restart_still_gathers_the_other_nodes_failures():
    dog, state, clock = make(world=2)
    state.meta = {"nnodes": "2"}
    for rank in (0, 1):
        feed(dog, state, {"type": "rank_gone", "rank": rank, "wall": 0.0})
    feed(dog, state, failure(1, -9))
    feed(dog, state, {"type": "group_restart", "node": 0, "restart": 1, "remaining": 2, "wall": 0.0})
    assert dog.tick() == []
    clock.now += 0.5
    assert [v.kind for v in dog.tick()] == ["crash"]


def attempt(
    dog: Watchdog, state: JobState, number: int, last_step: int, first_step: int = 0, checkpoint: int | None = None, world: int = 2
) -> list:
    """An attempt's ranks say hello and step from first_step to last_step (none when below it),
    maybe checkpointing; then torchrun asks to restart after it. The verdicts of that ask."""
    for rank in range(world):
        feed(dog, state, hello(rank, restart=number, world=world))
    for n in range(first_step, last_step + 1):
        for rank in range(world):
            feed(dog, state, step(rank, n))
        if n == checkpoint:
            feed(dog, state, builders.build("checkpoint", rank=0, step=n, path="c.pt", bytes=1, write_ms=1.0))
    ask = builders.build("group_restart", node=0, restart=number + 1, remaining=9)
    return [v for v in feed(dog, state, ask) + feed(dog, state, ask) if v.kind == "no-progress"]


def test_attempts_that_get_no_further_stop_the_job_at_the_third_in_a_row():
    dog, state, _ = make(world=2)
    assert attempt(dog, state, 0, 250) == []
    assert attempt(dog, state, 1, 250, first_step=200) == [], "no further than 250: one"
    assert attempt(dog, state, 2, 251, first_step=200) == [], "past 250: progress, the row starts again"
    assert attempt(dog, state, 3, 230, first_step=200) == []
    assert attempt(dog, state, 4, -1) == [], "failed before its first step: two"
    [verdict] = attempt(dog, state, 5, 251, first_step=200)
    assert verdict.action == "stop" and verdict.text == (
        "3 attempts in a row got no further (past step 251: attempt 3 to step 230, attempt 4 before its first step, "
        "attempt 5 to step 251); a restart cannot help, stopping the job"
    )


def test_in_a_job_that_checkpoints_an_attempt_without_a_new_checkpoint_made_no_progress():
    dog, state, _ = make(WatchPolicy(no_progress=2), world=2)
    assert attempt(dog, state, 0, 120, checkpoint=100) == []
    assert attempt(dog, state, 1, 190, first_step=101) == [], "further, but no checkpoint: lost again"
    [verdict] = attempt(dog, state, 2, 195, first_step=101)
    assert "or to a new checkpoint" in verdict.text
    off, off_state, _ = make(WatchPolicy(no_progress=0), world=2)
    assert [v for n in range(5) for v in attempt(off, off_state, n, -1)] == []
