"""Where a job's wall time went, from plain records: productive steps, and what start-up,
restarts, recomputed steps, the NaN guard and stalls took."""

from __future__ import annotations

import pytest

from ddptop.core.format import span
from ddptop.core.model.goodput import PARTS, Goodput, text


def job(goodput: Goodput, attempt: int, steps: range, start: float, step_s: float = 0.1, skipped: int = -1, ranks: int = 2) -> float:
    for rank in range(ranks):
        goodput.observe({"type": "rank_hello", "rank": rank, "restart": attempt})
    wall = start
    for step in steps:
        wall += step_s
        for rank in range(ranks):  # rank 1's times differ: rank 0's are counted
            extra = {"skipped": "nan"} if step == skipped else {}
            goodput.observe(
                {"type": "step", "rank": rank, "step": step, "step_ms": step_s * 1000 * (1.1 if rank else 1.0), "wall": wall, **extra}
            )
    return wall


def test_a_job_with_a_failure_and_a_resume_splits_its_wall_time():
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 100.0})
    goodput.observe({"type": "checkpoint", "rank": 0, "wall": 103.0, "step": 39, "path": "c", "bytes": 1, "write_ms": 500.0})
    end = job(goodput, 0, range(50), start=105.0, skipped=10)  # the first step starts at 105: 5 s of start-up
    end = job(goodput, 1, range(40, 60), start=end + 3.0)  # 3 s to restart; resumed at 40: 10 steps again
    mid = goodput.split(end)  # a look mid-run changes nothing
    goodput.observe({"type": "exit", "wall": end + 1.0, "code": 0})
    split = goodput.split()
    assert mid is not None and split is not None and mid["wall_s"] == pytest.approx(split["wall_s"] - 1.0)
    step = 0.1
    assert split["startup_s"] == pytest.approx(105.0 - 100.0)
    assert split["skipped_s"] == pytest.approx(step) and split["recomputed_s"] == pytest.approx(10 * step)
    assert split["productive_s"] == pytest.approx(59 * step) and split["stalled_s"] == 0.0
    assert split["failures"] == 1
    assert split["checkpoint_every_s"] == pytest.approx((2 * 0.5 * split["wall_s"] / 1) ** 0.5, abs=0.05)
    assert sum(split[f"{p}_s"] for p in PARTS) == pytest.approx(split["wall_s"])
    assert text(split).startswith(f"goodput {split['goodput']:.0%} of {span(split['wall_s'])}; lost: startup 5.0 s")


def test_the_goodput_line_reads_a_day_in_hours_and_a_sub_second_interval_in_tenths():
    """A day's run read "of 86400.0 s", and a checkpoint interval under a second "every 0 s"."""
    split = {"wall_s": 86_400.0, "goodput": 0.9, "failures": 1, "checkpoint_every_s": 0.2}
    split |= {f"{part}_s": 0.0 for part in PARTS}
    split |= {"startup_s": 2.0, "restarts_s": 1_500.0, "recomputed_s": 300.0, "other_s": 1.7}
    assert text(split) == (
        "goodput 90% of 24.0 h; lost: startup 2.0 s, restarts 25 min, recomputed 5.0 min, after the last step 1.7 s; "
        "checkpoint every 0.2 s for 1 failure (Young/Daly)"
    )
    assert [span(s) for s in (0.04, 9.96, 84.2, 119.0, 7199.0)] == ["0.0 s", "10.0 s", "84 s", "119 s", "120 min"]


def test_a_step_far_over_the_job_s_pace_is_a_stall():
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 0.0})
    end = job(goodput, 0, range(30), start=0.0, step_s=0.1, ranks=1)
    goodput.observe({"type": "step", "rank": 0, "step": 30, "step_ms": 40_000.0, "wall": end + 40.0})
    split = goodput.split(end + 40.0)
    assert split is not None and split["stalled_s"] == pytest.approx(40.0 - 15.0)


def test_a_long_step_the_watchdog_called_a_pause_is_paused_and_one_it_called_a_stall_is_stalled():
    """Rank 0 evaluating alone for 40 s: the watchdog said "rank 1 waits for rank 0", so the goodput
    line must not call that time stalled. Where the pause turned into a stall (the evaluation hung),
    or nothing was said, it is stalled. The record of the step before the evaluation comes after
    the verdicts, as a rank sends it once its next step begins."""

    def fold(*verdicts: dict[str, object]) -> dict[str, float]:
        goodput = Goodput()
        goodput.observe({"type": "run", "wall": 0.0})
        end = job(goodput, 0, range(29), start=0.0, ranks=1) + 0.1
        for verdict in verdicts:
            goodput.observe({"wall": end + 15.0, "text": "...", **verdict})
        goodput.observe({"type": "step", "rank": 0, "step": 29, "step_ms": 100.0, "wall": end})
        goodput.observe({"type": "step", "rank": 0, "step": 30, "step_ms": 40_000.0, "wall": end + 40.0})
        split = goodput.split(end + 40.0)
        assert split is not None
        return split

    pause, stall = {"type": "notice", "kind": "pause"}, {"type": "alert", "kind": "stall"}
    paused = fold(pause)  # all of it beyond the job's 0.1 s steps
    assert (paused["paused_s"], paused["stalled_s"]) == (pytest.approx(39.9), 0.0)
    assert "lost: paused 40 s" in text(paused)
    for split in (fold(pause, stall), fold()):
        assert (split["stalled_s"], split["paused_s"]) == (pytest.approx(25.0), 0.0)


def test_an_evaluation_too_short_for_a_pause_is_paused_once_whether_or_not_a_pause_was_told():
    """Rank 0's record tells its 5 s evaluation apart: those 5 s are paused, not productive. An
    evaluation long enough for the watchdog's pause is counted once, as the pause's."""
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 0.0})
    end = job(goodput, 0, range(30), start=0.0, ranks=1)
    goodput.observe({"type": "step", "rank": 0, "step": 30, "step_ms": 5_100.0, "eval_ms": 5_000.0, "wall": end + 5.1})
    split = goodput.split(end + 5.1)
    assert split is not None and (split["paused_s"], split["stalled_s"]) == (pytest.approx(5.0), 0.0)
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 0.0})
    end = job(goodput, 0, range(30), start=0.0, step_s=0.1, ranks=1)
    goodput.observe({"type": "notice", "kind": "pause", "wall": end + 15.0, "text": "rank 1 waits for rank 0, evaluating"})
    goodput.observe({"type": "step", "rank": 0, "step": 30, "step_ms": 40_100.0, "eval_ms": 40_000.0, "wall": end + 40.1})
    split = goodput.split(end + 40.1)
    assert split is not None and split["paused_s"] == pytest.approx(40.0)


def test_a_pause_in_an_attempt_that_failed_is_not_the_next_attempt_s_first_step():
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 0.0})
    end = job(goodput, 0, range(30), start=0.0, ranks=1)
    goodput.observe({"type": "notice", "kind": "pause", "wall": end + 15.0, "text": "rank 0 works between steps"})
    goodput.observe({"type": "rank_hello", "rank": 0, "restart": 1})  # it crashed in the pause
    goodput.observe({"type": "step", "rank": 0, "step": 30, "step_ms": 8_000.0, "wall": end + 30.0})  # resumed, slow to warm up
    split = goodput.split(end + 30.0)
    assert split is not None and split["paused_s"] == 0.0


def test_a_job_that_ends_stuck_spent_its_tail_stalled_and_one_that_recovers_did_not():
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 0.0})
    end = job(goodput, 0, range(29), start=0.0, ranks=1) + 0.1
    goodput.observe({"type": "alert", "kind": "stall", "wall": end + 15.0, "text": "..."})
    goodput.observe({"type": "alert", "kind": "hang", "wall": end + 300.0, "text": "..."})
    # Stuck before its next forward (a data loader that hangs): its last step's record comes at its exit.
    goodput.observe({"type": "step", "rank": 0, "step": 29, "step_ms": 100.0, "wall": end})
    goodput.observe({"type": "exit", "wall": end + 301.0, "code": 143})
    split = goodput.split()
    assert split is not None and split["stalled_s"] == pytest.approx(301.0) and split["other_s"] == pytest.approx(0.0)

    recovered = Goodput()
    recovered.observe({"type": "run", "wall": 0.0})
    end = job(recovered, 0, range(30), start=0.0, ranks=1)
    recovered.observe({"type": "alert", "kind": "stall", "wall": end + 15.0, "text": "..."})
    recovered.observe({"type": "step", "rank": 0, "step": 30, "step_ms": 16_100.0, "wall": end + 16.1})  # the step it was stuck in
    recovered.observe({"type": "exit", "wall": end + 18.1, "code": 0})
    split = recovered.split()
    assert split is not None and split["other_s"] == pytest.approx(2.0)


def test_a_hang_that_the_group_restarts_after_is_stalled_and_the_restart_after_it_is_not():
    """The default hang restart: no step for 300 s, the hang verdict, ddptop kills the group and
    torchrun restarts it. The 300 s were the hang's; only what came after the verdict restarted."""
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 0.0})
    end = job(goodput, 0, range(30), start=0.0, ranks=1)
    goodput.observe({"type": "alert", "kind": "stall", "wall": end + 15.0, "text": "..."})
    goodput.observe({"type": "alert", "kind": "hang", "wall": end + 300.0, "text": "..."})
    end = job(goodput, 1, range(30, 40), start=end + 302.0, ranks=1)
    goodput.observe({"type": "exit", "wall": end, "code": 0})
    split = goodput.split()
    assert split is not None and split["stalled_s"] == pytest.approx(300.0) and split["restarts_s"] == pytest.approx(2.0)


def test_nothing_known_is_no_split_and_no_step_is_all_start_up():
    goodput = Goodput()
    assert goodput.split(10.0) is None
    goodput.observe({"type": "run", "wall": 0.0})
    split = goodput.split(10.0)
    assert split is not None and (split["startup_s"], split["goodput"]) == (10.0, 0.0)


def test_a_slow_first_step_does_not_set_the_pace_of_the_next_hundred():
    """torch.compile's first step took 60 s; the next ones 0.1 s. A 40 s stall at step 10 is one."""
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 0.0})
    goodput.observe({"type": "rank_hello", "rank": 0, "restart": 0})
    goodput.observe({"type": "step", "rank": 0, "step": 0, "step_ms": 60_000.0, "wall": 60.0})
    end = job(goodput, 0, range(1, 10), start=60.0, ranks=1)
    goodput.observe({"type": "step", "rank": 0, "step": 10, "step_ms": 40_000.0, "wall": end + 40.0})
    split = goodput.split(end + 40.0)
    assert split is not None and split["stalled_s"] == pytest.approx(40.0 - 15.0)


def test_a_second_pause_notice_read_before_the_step_that_held_the_pause_leaves_it_paused():
    """Rank 0 writes a checkpoint for 40 s: the watchdog tells of the pause 15 s in. Rank 1 then
    ends, and the watchdog tells of rank 0 working alone, in a notice its record reaches the
    supervisor before the step that held the pause, though that step ended first (seen in CI).
    The step is still the pause's: its time was moved to stalled."""
    goodput = Goodput()
    goodput.observe({"type": "run", "wall": 0.0})
    end = job(goodput, 0, range(30), start=0.0, step_s=0.1, ranks=1)
    goodput.observe({"type": "notice", "kind": "pause", "wall": end + 15.0, "text": "rank 1 waits for rank 0, checkpointing"})
    goodput.observe({"type": "notice", "kind": "pause", "wall": end + 40.05, "text": "rank 0 works between steps, checkpointing"})
    goodput.observe({"type": "step", "rank": 0, "step": 30, "step_ms": 40_000.0, "wall": end + 40.0})
    split = goodput.split(end + 40.1)
    assert split is not None and (split["paused_s"], split["stalled_s"]) == (pytest.approx(39.9), 0.0)
