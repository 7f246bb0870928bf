"""The job model folding the supervisor's samples: each rank shows its own GPU's latest reading."""

from __future__ import annotations

import builders
import pytest
from test_history import restored

from ddptop.core.model import snapshot, summary
from ddptop.core.model.job import JobState
from ddptop.core.model.metrics import BUS_BANDWIDTH, COMM_MS, COMM_SHARE, DATA_MS, GPU_USED, GPU_UTIL, RSS, SAMPLES_PER_S, TOKENS_PER_S
from ddptop.core.model.sharded_norm import KEPT_STEPS
from ddptop.core.model.stats import WINDOW, StepPoint
from ddptop.core.wire.records import WINDOWED


def hello(rank: int, node: int) -> dict:
    return builders.hello(rank, 2, local_rank=0, node=node, host=f"h{node}")


def sample(node: int, rank: int, util: float) -> dict:
    """One node's sample: its rank on GPU 0, and GPU 0's reading (indices repeat on every node)."""
    return {
        "type": "sample",
        "wall": 1.0,
        "node": node,
        "procs": [{"rank": rank, "pid": 10 + rank, "cpu": 50.0, "rss": 1 << 20, "gpu": 0, "gpu_mem": 1 << 30}],
        "gpus": [{"index": 0, "name": "H100", "util": util, "mem_used": 1 << 30, "mem_total": 80 << 30}],
    }


def test_each_rank_shows_its_own_node_s_gpu_and_its_latest_reading():
    state = JobState()
    for rank in (0, 1):
        state.ingest(hello(rank, node=rank))
    state.ingest(sample(0, 0, util=30.0))
    state.ingest(sample(1, 1, util=90.0))
    assert [GPU_UTIL.read(state.ranks[r]) for r in (0, 1)] == [30.0, 90.0]
    state.ingest(sample(0, 0, util=40.0))
    assert [GPU_UTIL.read(state.ranks[r]) for r in (0, 1)] == [40.0, 90.0]
    assert GPU_USED.format(state.ranks[0]).endswith("1.0 GiB pk -/80.0 GiB")


def test_a_rank_s_last_place_stands_once_its_heartbeats_carry_none():
    """An exiting rank's main thread has left the script: its final heartbeat says no place."""
    state = JobState()
    state.ingest(hello(0, node=0))
    beat = {"type": "heartbeat", "rank": 0, "wall": 1.0, "phase": "forward", "step": 4, "dropped": 0}
    state.ingest({**beat, "where": "train.py:51 in train_step"})
    state.ingest({**beat, "phase": "exit"})
    assert state.ranks[0].where == "train.py:51 in train_step"


def test_a_rank_that_steps_before_its_next_heartbeat_is_no_longer_shown_starting_up():
    """Heartbeats come once a second, steps many times: the table said "startup" beside a step count going up."""
    state = JobState()
    state.ingest(hello(0, node=0))
    assert state.ranks[0].phase == "startup"
    state.ingest(builders.step(0, 0))
    assert state.ranks[0].phase == "data"
    state.ingest({"type": "heartbeat", "rank": 0, "wall": 1.0, "phase": "backward", "step": 1, "dropped": 0})
    state.ingest(builders.step(0, 1))
    assert state.ranks[0].phase == "backward", "a heartbeat's phase stands"


def test_comm_share_is_of_the_sampled_iterations_own_time_so_a_slow_one_never_reads_over_100_percent():
    """4 ranks on 2 cores: the iteration DDP sampled took 30 ms, 25 of them in its all-reduce
    (5 beside the backward), while the steps around it took 10 ms."""
    state = JobState()
    state.ingest(hello(0, 0))
    for n in range(5):
        state.ingest(builders.step(0, n, wall=float(n)))
    state.ingest(builders.step(0, 5, wall=5.0, step_ms=30.0, comm_ms=25.0, compute_ms=10.0, comm_overlap_ms=5.0))
    assert COMM_SHARE.read(state.ranks[0]) == 25.0 / 30.0
    assert COMM_SHARE.format(state.ranks[0]) == "83%"
    state.ingest(hello(1, 0))
    state.ingest(builders.step(1, 0, wall=1.0, step_ms=10.0, comm_ms=2.0))  # an earlier ddptop's record: no compute
    assert COMM_SHARE.read(state.ranks[1]) == 0.2
    # A GAN's discriminator, sampled in its generator's step: DDP timed 0.03 ms of compute, 0.28 beside the comm.
    state.ingest(hello(2, 0))
    state.ingest(builders.step(2, 0, wall=1.0, step_ms=5.0, comm_ms=3.0, compute_ms=0.03, comm_overlap_ms=0.28))
    assert COMM_SHARE.read(state.ranks[2]) == 1.0


def test_comm_figures_stand_until_the_next_sampled_iteration_once_the_window_has_none():
    """DDP samples one iteration in 100, the window's length: its figures often fall out
    of the window before the next arrive, and COMM MS and COMM % would blink to "-"."""
    state = JobState()
    state.ingest(hello(0, 0))
    state.ingest(builders.step(0, 0, wall=0.0, comm_ms=4.0, compute_ms=6.0, comm_overlap_ms=2.0, comm_bytes=1024))
    for n in range(1, 2 * WINDOW):
        state.ingest(builders.step(0, n, wall=float(n)))
    rank = state.ranks[0]
    assert rank.window.mean("comm_ms") is None, "the sampled step left the window"
    assert (COMM_MS.read(rank), COMM_SHARE.read(rank)) == (4.0, 0.5)
    state.ingest(builders.step(0, 2 * WINDOW, wall=200.0, comm_ms=8.0, compute_ms=8.0, comm_overlap_ms=0.0, comm_bytes=1024))
    assert (COMM_MS.read(rank), COMM_SHARE.read(rank)) == (8.0, 0.5)


def test_the_all_reduce_s_bus_bandwidth_is_nccl_tests_of_ddp_s_sampled_bytes_and_time_and_reads_in_the_summary():
    """2 ranks all-reduce 1 MiB in 10 ms: algbw 104.9 MB/s, and busbw the same, 2(n-1)/n being 1.
    A rank alone all-reduces with nobody: no figure, and no part of the line."""
    for world, shown in ((2, "busbw 104.9 MB/s"), (1, None)):
        state = JobState()
        for rank in range(world):
            state.ingest(builders.hello(rank, world))
            state.ingest(builders.step(rank, 0, wall=1.0, comm_ms=10.0, compute_ms=20.0, comm_bytes=1 << 20))
        parts = summary.line(state.totals(), 5.0).split(" | ")
        assert "comm 10.0 ms (33%)" in parts
        if shown is None:
            assert BUS_BANDWIDTH.read(state.ranks[0]) is None and not any(p.startswith("busbw") for p in parts), parts
        else:
            assert state.totals().of(BUS_BANDWIDTH) == pytest.approx((1 << 20) / 0.010)
            assert parts[parts.index("comm 10.0 ms (33%)") + 1] == shown, parts


def test_a_step_value_of_the_wire_s_table_is_kept_as_the_table_says():
    state = JobState()
    state.ingest(hello(0, 0))
    for n, lr in enumerate((0.1, 0.05)):
        state.ingest(builders.step(0, n, wall=float(n), samples=8, lr=lr, comm_ms=2.0))
    state.ingest(builders.step(0, 2, wall=2.0, samples=8))
    rank = state.ranks[0]
    assert rank.latest["lr"] == 0.05, "kept latest: a step without it leaves the last one standing"
    assert [p.get("samples") for p in rank.window.points] == [8, 8, 8] and rank.window.mean("comm_ms") == 2.0
    assert ("wall", "step_ms", *WINDOWED) == StepPoint.FIELDS
    assert state.summary(2.0)["metrics"]["lr"] == 0.05


def test_a_job_runs_until_every_rank_has_exited_and_again_once_a_restarted_one_says_hello():
    """What the headless summary lines follow: none once every rank is gone, where the last would
    only repeat itself before the final line."""
    state = JobState()
    assert state.running(), "starting: no rank has said hello yet"
    for rank in (0, 1):
        state.ingest(builders.hello(rank, 2))
    state.ingest({"type": "rank_gone", "rank": 0, "wall": 2.0})
    assert state.running()
    state.ingest({"type": "rank_gone", "rank": 1, "wall": 2.0})
    assert not state.running()
    state.ingest(builders.hello(1, 2, restart=1))
    assert state.running()


def test_a_step_that_held_a_pause_stays_out_of_the_ranks_rates_and_means():
    """Rank 0 evaluated alone for 30 s between two steps while rank 1 waited in its all-reduce.
    The watchdog told of the pause; the step each rank was in then is left out, so afterwards
    both read their training's samples/s and data wait, not an evaluation's. Without the notice
    (a data stall no rank worked through) the long step counts."""

    def fold(notice: bool) -> JobState:
        state = JobState()
        for rank in (0, 1):
            state.ingest(hello(rank, node=0))
        wall = 100.0
        for n in range(60):
            if n == 30:
                if notice:
                    state.ingest({"type": "notice", "wall": wall + 15.0, "text": "rank 1 waits for rank 0", "kind": "pause"})
                wall += 30.0
                step_ms, data_ms = (30_100.0, [30_000.0, 10.0])
            else:
                step_ms, data_ms = (100.0, [10.0, 10.0])
            wall += 0.1
            for rank in (0, 1):
                state.ingest(builders.step(rank, n, wall=wall, step_ms=step_ms, data_ms=data_ms[rank], samples=32))
        return state

    paused = fold(notice=True)
    for rank in (0, 1):
        assert SAMPLES_PER_S.read(paused.ranks[rank]) == pytest.approx(320.0)
        assert DATA_MS.read(paused.ranks[rank]) == pytest.approx(10.0)
        assert paused.ranks[rank].window.step_ms(100) == pytest.approx(100.0)
    assert restored(list(snapshot.frames(paused))).ranks[0].window.rate("samples") == pytest.approx(320.0)
    stalled = fold(notice=False)
    assert SAMPLES_PER_S.read(stalled.ranks[0]) == pytest.approx(59 * 32 / (59 * 0.1 + 30.0))
    assert DATA_MS.read(stalled.ranks[0]) == pytest.approx((59 * 10.0 + 30_000.0) / 60)


def test_an_evaluation_shorter_than_a_pause_stays_out_of_every_ranks_rates():
    """Rank 0 evaluated alone for 5 s between steps 29 and 30, too short for the watchdog to tell
    of a pause; rank 1 waited in its all-reduce. Rank 0's record says so (eval_ms, eval_ended),
    whichever rank's record comes first: both read their training's samples/s after it, and rank
    0's data wait is its own."""
    for first in (0, 1):
        state = JobState()
        for rank in (0, 1):
            state.ingest(hello(rank, node=0))
        wall = 100.0
        for n in range(60):
            evaluated = {}
            if n == 30:
                evaluated = {"eval_ms": 5000.0, "eval_ended": wall + 5.0}
                wall += 5.0
            wall += 0.1
            for rank in (first, 1 - first):
                step_ms = 5100.0 if evaluated else 100.0
                extra = evaluated if rank == 0 else {}
                state.ingest(builders.step(rank, n, wall=wall, step_ms=step_ms, data_ms=10.0, samples=32, **extra))
        for rank in (0, 1):
            assert SAMPLES_PER_S.read(state.ranks[rank]) == pytest.approx(320.0), (first, rank)
            assert DATA_MS.read(state.ranks[rank]) == pytest.approx(10.0)


def test_a_pause_in_an_attempt_that_failed_leaves_the_next_attempt_s_steps_in():
    state = JobState()
    state.ingest(hello(0, node=0))
    state.ingest({"type": "notice", "wall": 50.0, "text": "rank 0 works between steps", "kind": "pause"})
    state.ingest(builders.hello(0, 1, restart=1))  # the rank crashed in it; torchrun restarted the group
    for n in range(2):
        state.ingest(builders.step(0, n, wall=100.0 + n))
    assert len(state.ranks[0].window.points) == 2


def stepping(ranks: int, **fields: float) -> tuple[JobState, float]:
    """A job of these many ranks that has run 20 steps of 100 ms, 32 samples each, 10 a second;
    and the wall clock at its last."""
    state = JobState()
    for rank in range(ranks):
        state.ingest(builders.hello(rank, ranks))
    wall = 100.0
    for n in range(20):
        wall += 0.1
        for rank in range(ranks):
            state.ingest(builders.step(rank, n, wall=wall, step_ms=100.0, data_ms=2.0, samples=32, **fields))
    return state, wall


def test_a_pipeline_s_samples_are_counted_once_though_every_stage_s_ranks_see_them():
    """Four ranks, two pipeline stages each replicated over two of them ({0,2} and {1,3}): every
    sample passes through a rank of each stage, so the job has trained 2 x 32 samples a step,
    not 4 x 32. Each rank's own rate stays its own, and the all-reduce's bus bandwidth is a
    group of two's."""
    state, wall = stepping(4, tokens=32 * 64, comm_ms=10.0, comm_bytes=1 << 20)
    before = state.totals()
    assert before.of(SAMPLES_PER_S) == pytest.approx(4 * 320.0)
    for rank in range(4):
        state.ingest(
            {
                "type": "heartbeat",
                "rank": rank,
                "wall": wall,
                "phase": "data",
                "step": 20,
                "dropped": 0,
                "replicas": [rank % 2, rank % 2 + 2],
            }
        )
    totals = state.totals()
    assert totals.of(SAMPLES_PER_S) == pytest.approx(2 * 320.0)
    assert totals.of(TOKENS_PER_S) == pytest.approx(2 * 320.0 * 64)
    assert SAMPLES_PER_S.read(state.ranks[3]) == pytest.approx(320.0)
    # 1 MiB in 10 ms: algbw 104.9 MB/s, times 2(n-1)/n: 3/2 over the job's 4 ranks, 1 over a stage's 2.
    assert before.of(BUS_BANDWIDTH) == pytest.approx(1.5 * (1 << 20) / 0.010)
    assert totals.of(BUS_BANDWIDTH) == pytest.approx((1 << 20) / 0.010)
    late = restored(list(snapshot.frames(state)))  # a dashboard that attaches now
    assert late.totals().of(SAMPLES_PER_S) == pytest.approx(2 * 320.0)
    assert late.totals().of(BUS_BANDWIDTH) == totals.of(BUS_BANDWIDTH)
    assert late.lags() == state.lags() and set(state.lags()) == {0, 1, 2, 3}


def test_a_batch_every_rank_of_a_tensor_parallel_job_is_given_is_counted_once():
    """Tensor parallelism alone over two ranks: both are given the same 32 samples a step, and
    say so (batch_shared); the job trained 32 a step, not 64, and still sets each rank against
    the other (no replicas: every rank does the same work). A late dashboard reads the same."""
    state, wall = stepping(2)
    assert state.totals().of(SAMPLES_PER_S) == pytest.approx(2 * 320.0)
    for rank in range(2):
        state.ingest({"type": "heartbeat", "rank": rank, "wall": wall, "phase": "data", "step": 20, "dropped": 0, "batch_shared": 2})
    assert state.totals().of(SAMPLES_PER_S) == pytest.approx(320.0)
    assert SAMPLES_PER_S.read(state.ranks[1]) == pytest.approx(320.0), "a rank's own rate stays its own"
    assert set(state.lags()) == {0, 1}
    assert restored(list(snapshot.frames(state))).totals().of(SAMPLES_PER_S) == pytest.approx(320.0)


def test_a_rank_that_stopped_stepping_reads_a_falling_rate_and_the_job_with_it():
    """Rank 1 stuck after step 49 while its heartbeats still come, rank 0 waiting for it in the
    all-reduce: a headless line said "13,536 samples/s" through a 40 s stall, as its last steps
    had. Both ranks' rates, and the job's, fall as the stall goes on; a rank that has exited
    keeps the rate its steps ended at."""
    state = JobState()
    for rank in (0, 1):
        state.ingest(hello(rank, node=0))
    for n in range(50):
        for rank in (0, 1):
            state.ingest(builders.step(rank, n, wall=100.0 + 0.1 * n, step_ms=100.0, samples=32))
    steady = state.totals().of(SAMPLES_PER_S)
    assert steady == pytest.approx(640.0)
    for rank in (0, 1):
        state.ingest({"type": "heartbeat", "rank": rank, "wall": 104.95, "phase": "backward", "step": 50, "dropped": 0})
    assert state.totals().of(SAMPLES_PER_S) == pytest.approx(steady)
    for rank in (0, 1):
        state.ingest({"type": "heartbeat", "rank": rank, "wall": 124.9 + 0.1, "phase": "backward", "step": 50, "dropped": 0})
    falling = 49 * 32 / (4.9 + 20.0)
    assert [SAMPLES_PER_S.read(state.ranks[r]) for r in (0, 1)] == [pytest.approx(falling)] * 2
    assert state.totals().of(SAMPLES_PER_S) == pytest.approx(2 * falling)
    state.ingest({"type": "rank_gone", "rank": 1, "wall": 125.0})
    assert SAMPLES_PER_S.read(state.ranks[1]) == pytest.approx(320.0)
    # While the job runs, a rank gone makes no samples and holds no memory: the job's figures are
    # the running ranks' (a restart's gap showed the last attempt's throughput); at its end, all.
    state.ingest({"type": "sample", "wall": 125.0, "procs": [{"rank": r, "pid": 100 + r, "rss": 1 << 30} for r in (0, 1)]})
    assert state.totals().of(SAMPLES_PER_S) == pytest.approx(falling)
    assert state.totals().of(RSS) == 1 << 30
    assert state.figure(SAMPLES_PER_S, [state.ranks[1]]) is None  # a node of that rank alone, as the rollup reads it
    state.ingest({"type": "exit", "wall": 126.0, "code": 0})
    assert state.totals().of(SAMPLES_PER_S) == pytest.approx(640.0)
    assert state.figure(SAMPLES_PER_S, [state.ranks[1]]) == pytest.approx(320.0)
    assert state.totals().of(RSS) == 2 << 30


def test_a_new_attempt_s_rates_and_comm_are_its_own_not_stretched_over_the_restart():
    """The group restarted 8 s after rank 0's last step; the new attempt steps at the old pace. Its
    window held the failed attempt's steps too, so its samples/s read over the gap: a job that
    resumed at full speed read a fraction of it for its first hundred steps."""
    state = JobState()
    state.ingest(hello(0, node=0))
    for n in range(50):
        state.ingest(builders.step(0, n, wall=100.0 + 0.1 * n, step_ms=100.0, samples=32, comm_ms=5.0))
    state.ingest(builders.hello(0, 1, restart=1))
    assert SAMPLES_PER_S.read(state.ranks[0]) is None and COMM_MS.read(state.ranks[0]) is None
    for n in range(10):
        state.ingest(builders.step(0, n, wall=113.0 + 0.1 * n, step_ms=100.0, samples=32))
    assert SAMPLES_PER_S.read(state.ranks[0]) == pytest.approx(320.0)
    state.ingest(builders.hello(0, 1, restart=1))  # the same attempt's hello again: its steps stay
    assert len(state.ranks[0].window.points) == 10


def test_a_sharded_step_s_grad_norm_is_added_up_from_every_rank_s_share_once_the_last_comes():
    """Two ranks' shares of step 5 (3 and 1) make its norm, 2, every rank's grad norm; each rank
    keeps its own shards' norm. A step one rank has not told yet shows nothing new."""
    state = JobState()
    for rank in (0, 1):
        state.ingest(builders.hello(rank, 2))
    state.ingest(builders.step(0, 5, shard_norm=3**0.5, grad_sq_share=3.0))
    assert "grad_norm" not in state.ranks[0].latest and state.sharded_norm.latest is None
    state.ingest(builders.step(1, 5, shard_norm=1.0, grad_sq_share=1.0))
    assert [state.ranks[r].latest["grad_norm"] for r in (0, 1)] == [pytest.approx(2.0)] * 2
    assert [state.ranks[r].latest["shard_norm"] for r in (0, 1)] == [pytest.approx(3**0.5), 1.0]
    assert state.sharded_norm.latest == (5, pytest.approx(2.0))
    state.ingest(builders.step(0, 6, shard_norm=3.0, grad_sq_share=9.0))
    assert state.ranks[0].latest["grad_norm"] == pytest.approx(2.0), "step 6 waits for rank 1"


def test_a_step_whose_last_share_never_comes_is_let_go_and_later_steps_still_add_up():
    """A rank that died mid-step leaves its step incomplete: the shares kept stay bounded."""
    state = JobState()
    for rank in (0, 1):
        state.ingest(builders.hello(rank, 2))
    for step in range(KEPT_STEPS * 3):
        state.ingest(builders.step(0, step, shard_norm=1.0, grad_sq_share=1.0))
    assert state.sharded_norm.waiting <= KEPT_STEPS + 1 and state.sharded_norm.latest is None
    last = KEPT_STEPS * 3 - 1
    state.ingest(builders.step(1, last, shard_norm=2.0, grad_sq_share=8.0))
    assert state.sharded_norm.latest == (last, pytest.approx(3.0))


def test_a_sharded_rank_s_compute_is_the_median_of_more_timed_steps_than_ddp_s():
    """A sharded rank's compute is its timed step less its waits (trainer/collective_timer.py),
    which holds every delay of its own: two steps descheduled on a busy host move a median of
    three, not of nine."""
    state = JobState()
    for n, compute in enumerate([20.0] * 8 + [80.0, 80.0], start=10):
        state.ingest(builders.step(0, n, compute_ms=compute, comm_step=n, sharded=True))
        state.ingest(builders.step(1, n, compute_ms=compute, comm_step=n))
    assert state.ranks[1].compute_samples == [20.0, 80.0, 80.0] and state.ranks[1].compute_ms() == 80.0
    assert state.ranks[0].compute_samples == [20.0] * 7 + [80.0, 80.0] and state.ranks[0].compute_ms() == 20.0
