"""The step tracker as plain Python, with a hand-driven clock."""

import threading

import pytest

from ddptop.core import launch_env
from ddptop.trainer.steps import MAX_WAITING, SEAL_AFTER_S, StepTracker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class NotYet:
    """A Late value whose event has not passed until told."""

    def __init__(self, value: float) -> None:
        self.value, self.done = value, False

    def ready(self) -> bool:
        return self.done

    def get(self) -> float:
        return self.value


def make() -> tuple[StepTracker, list, Clock]:
    out: list = []
    clock = Clock()
    return StepTracker(rank=3, emit=out.append, clock=clock), out, clock


def run_step(tracker: StepTracker, clock: Clock, data_s: float, compute_s: float, batches=(8,)) -> None:
    clock.now += data_s
    for size in batches:
        tracker.forward_begin(size)
    clock.now += compute_s
    tracker.optimizer_begin({"grad_norm": 2.0})
    tracker.optimizer_end({"comm_ms": 1.5, "comm_bytes": 400})


def test_step_time_data_wait_and_samples_over_accumulated_forwards():
    tracker, out, clock = make()
    run_step(tracker, clock, data_s=0.5, compute_s=0.1, batches=(8, 8))
    run_step(tracker, clock, data_s=0.02, compute_s=0.1, batches=(8, 8))
    tracker.flush()
    first, second = out
    assert (first["step"], second["step"]) == (0, 1)
    assert round(first["step_ms"], 6) == 100.0 and "data_ms" not in first  # first step: from its forward
    assert round(second["step_ms"], 6) == 120.0
    assert round(second["data_ms"], 6) == 20.0
    assert second["samples"] == 16 and second["rank"] == 3
    assert second["grad_norm"] == 2.0 and second["comm_ms"] == 1.5 and second["comm_bytes"] == 400


def test_an_evaluation_between_two_steps_is_its_own_span_not_the_next_step_s_data_wait():
    """Rank 0 evaluates between steps 0 and 1 (forwards that are not training): 0.2 s of data
    wait before it, 3 s of forwards, 0.1 s of data after. Step 1's data wait is the 0.3 s; the
    evaluation goes with the record, ending where its last forward returned."""
    tracker, out, clock = make()
    run_step(tracker, clock, data_s=0.0, compute_s=0.1)
    clock.now += 0.2
    for _ in range(3):
        tracker.evaluating()
        assert tracker.phase == "eval"
        clock.now += 1.0
        tracker.evaluated()
    run_step(tracker, clock, data_s=0.1, compute_s=0.1)
    run_step(tracker, clock, data_s=0.05, compute_s=0.1)
    tracker.flush()
    first, second, third = out
    assert "eval_ms" not in first and "eval_ms" not in third and round(third["data_ms"], 6) == 50.0
    assert round(second["eval_ms"], 6) == 3000.0 and round(second["data_ms"], 6) == 300.0
    assert round(second["step_ms"], 6) == 3400.0, "the step still took what it took"
    assert round(second["wall"] - second["eval_ended"], 6) == 0.2, "the training forward 0.1 s later, and 0.1 s of it"


def test_a_step_s_samples_and_tokens_are_the_batches_of_the_model_that_began_it():
    """An encoder's batch fed on to a decoder, a GAN's discriminator stepping on real and
    generated batches: the second model's forwards are the same samples, not more. The
    next step may begin with the other model (a GAN's generator step)."""
    tracker, out, clock = make()
    encoder, decoder = 101, 202
    for _ in range(2):  # gradient accumulation: each micro-batch through both
        tracker.forward_begin(8, 64, encoder)
        tracker.forward_begin(8, 64, decoder)
    clock.now += 0.1
    tracker.optimizer_begin({})
    tracker.optimizer_end({})
    tracker.forward_begin(4, None, decoder)
    tracker.forward_begin(4, None, encoder)
    tracker.optimizer_begin({})
    tracker.optimizer_end({})
    tracker.flush()
    assert [(r["samples"], r.get("tokens")) for r in out] == [(16, 128), (4, None)]


def test_explicit_values_after_optimizer_step_join_that_step():
    tracker, out, clock = make()
    run_step(tracker, clock, 0.0, 0.1)
    tracker.explicit(loss=0.25, samples=10, tokens=1000)
    tracker.build()
    assert out == [], "held for monitor.step() until the next forward"
    tracker.forward_begin(8)
    tracker.build()
    assert out[0]["loss"] == 0.25 and out[0]["samples"] == 10 and out[0]["tokens"] == 1000


def test_steps_are_built_when_asked_in_order_and_an_event_goes_after_all_but_the_last():
    tracker, out, clock = make()
    for _ in range(3):
        run_step(tracker, clock, 0.0, 0.001)
    assert out == [], "the training thread builds nothing itself"
    tracker.forward_begin(8)
    tracker.build()  # the sender's thread, before its batch
    assert [r["step"] for r in out] == [0, 1, 2]
    run_step(tracker, clock, 0.0, 0.001)
    run_step(tracker, clock, 0.0, 0.001)
    tracker.event({"type": "checkpoint", "step": 4})  # monitor.checkpoint() before monitor.step()
    tracker.explicit(loss=0.5, samples=None, tokens=None)
    tracker.flush()
    assert [(r["type"], r["step"], r.get("loss")) for r in out[3:]] == [("step", 3, None), ("checkpoint", 4, None), ("step", 4, 0.5)]


class Loss:
    """A CPU loss tensor as the tracker sees one, counting where it is read."""

    is_cuda = False

    def __init__(self, value: float) -> None:
        self.value = value
        self.read_on: list[str] = []

    def numel(self) -> int:
        return 1

    def is_floating_point(self) -> bool:
        return True

    def item(self) -> float:
        self.read_on.append(threading.current_thread().name)
        return self.value


def backward_step(tracker: StepTracker, clock: Clock, *losses: Loss) -> None:
    """A step whose script called backward() on losses, as hooks.py hands them over."""
    clock.now += 0.01
    tracker.forward_begin(8)
    tracker.losses += losses
    tracker.optimizer_begin({})
    tracker.optimizer_end({})


def test_backward_losses_are_read_on_the_training_thread_once_the_next_step_begins():
    tracker, out, clock = make()
    first, second, third = Loss(1.0), Loss(0.5), Loss(2.0)
    backward_step(tracker, clock, first, second)  # gradient accumulation: two backward() calls
    built = threading.Thread(target=tracker.build, name="sender")
    built.start()
    built.join()
    assert first.read_on == [], "held for a monitor.step() after optimizer.step()"
    backward_step(tracker, clock, third)
    built = threading.Thread(target=tracker.build, name="sender")
    built.start()
    built.join()
    assert out[0]["loss"] == 1.5
    assert first.read_on == second.read_on == ["MainThread"]
    tracker.flush()  # at exit, on the training thread: the last step's too
    assert out[1]["loss"] == 2.0 and third.read_on == ["MainThread"]


def test_a_loss_monitor_step_gives_leaves_the_backward_losses_unread():
    tracker, out, clock = make()
    after, during = Loss(1.0), Loss(3.0)
    backward_step(tracker, clock, after)
    tracker.explicit(loss=Loss(0.25), samples=None, tokens=None)  # after optimizer.step(): for step 0
    clock.now += 0.01
    tracker.forward_begin(8)
    tracker.losses.append(during)
    tracker.explicit(loss=Loss(0.75), samples=None, tokens=None)  # before optimizer.step(): for step 1
    tracker.optimizer_begin({})
    tracker.optimizer_end({})
    tracker.flush()
    assert [r["loss"] for r in out] == [0.25, 0.75]
    assert after.read_on == during.read_on == []


def test_without_an_optimizer_each_step_keeps_its_own_backward_losses():
    """monitor.step() closes each step and gives no loss: the backward's are the step's."""
    tracker, out, clock = make()
    for step in range(3):
        clock.now += 0.01
        tracker.forward_begin(8)
        tracker.losses.append(Loss(float(step)))
        tracker.explicit(loss=None, samples=8, tokens=None)
    tracker.flush()
    assert [(r["step"], r["loss"]) for r in out] == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_a_loss_that_is_not_one_number_is_refused_in_the_scripts_call():
    """Read on the sender's thread, it would have stopped the sender; refused, the tracker goes on."""
    tracker, out, clock = make()

    class Batch(Loss):
        def item(self) -> float:
            raise RuntimeError("a Tensor with 4 elements cannot be converted to Scalar")

    for bad in (Batch(0.0), "low"):
        with pytest.raises(ValueError, match=r"^monitor.step\(loss=...\) takes a number or a one-element tensor"):
            tracker.explicit(loss=bad, samples=None, tokens=None)
    backward_step(tracker, clock, Loss(1.0))
    tracker.explicit(loss=0.5, samples=None, tokens=None)
    tracker.flush()
    assert [r["loss"] for r in out] == [0.5]


def test_steps_closed_with_no_forward_between_the_first_keeps_the_losses():
    """Two optimizers stepped after one backward() (two halves of a model):
    the losses are the first step's, read as the second closes."""
    tracker, out, clock = make()
    loss = Loss(1.0)
    backward_step(tracker, clock, loss)
    tracker.optimizer_begin({})
    tracker.optimizer_end({})
    assert loss.read_on == ["MainThread"]
    tracker.flush()
    assert [(r["step"], r.get("loss")) for r in out] == [(0, 1.0), (1, None)]


def test_explicit_values_before_optimizer_step_join_the_step_in_progress():
    tracker, out, clock = make()
    run_step(tracker, clock, 0.0, 0.1)
    tracker.forward_begin(8)  # ends what monitor.step() can add to step 0
    tracker.explicit(loss=0.5, samples=None, tokens=None)
    tracker.optimizer_begin({})
    tracker.optimizer_end({})
    tracker.flush()
    assert "loss" not in out[0] and out[1]["loss"] == 0.5


def test_steps_closed_with_no_forward_between_are_all_sent():
    """Two optimizers stepped one after the other (a GAN's, or two halves
    of a model): the first step's record is held for monitor.step() when
    the second closes, and must still go out."""
    tracker, out, clock = make()
    run_step(tracker, clock, 0.0, 0.1)
    tracker.optimizer_begin({"grad_norm": 3.0})
    tracker.optimizer_end({})
    tracker.flush()
    assert [(r["step"], r["grad_norm"]) for r in out] == [(0, 2.0), (1, 3.0)]


def test_without_an_optimizer_monitor_step_is_the_boundary():
    tracker, out, clock = make()
    for _ in range(3):
        clock.now += 0.05
        tracker.explicit(loss=1.0, samples=4, tokens=None)
    tracker.flush()
    assert [r["step"] for r in out] == [0, 1, 2]
    assert tracker.step == 3


def test_without_an_optimizer_each_monitor_step_gives_its_own_step_its_values():
    tracker, out, clock = make()
    for step in range(3):
        clock.now += 0.05
        tracker.explicit(loss=float(step), samples=4 + step, tokens=None)
    tracker.flush()
    assert [(r["step"], r["loss"], r["samples"]) for r in out] == [(0, 0.0, 4), (1, 1.0, 5), (2, 2.0, 6)]


def test_gpu_values_hold_a_record_until_readable_never_blocking():
    tracker, out, clock = make()
    pending = NotYet(7.0)
    clock.now += 0.1
    tracker.forward_begin(8)
    tracker.optimizer_begin({"grad_norm": pending})
    tracker.optimizer_end({})
    tracker.forward_begin(8)
    tracker.build()
    assert out == []
    pending.done = True
    tracker.optimizer_begin({})
    tracker.optimizer_end({})
    tracker.forward_begin(8)
    tracker.build()
    assert out[0]["grad_norm"] == 7.0


def test_a_value_that_never_becomes_readable_is_dropped_not_waited_for():
    tracker, out, _clock = make()
    for _ in range(MAX_WAITING + 4):
        tracker.forward_begin(8)
        tracker.optimizer_begin({"grad_norm": NotYet(1.0)})
        tracker.optimizer_end({})
        tracker.build()
    tracker.forward_begin(8)
    tracker.build()
    assert out and all("grad_norm" not in r for r in out)
    assert [r["step"] for r in out] == list(range(len(out)))


def test_a_late_value_read_as_none_leaves_its_field_out():
    tracker, out, _clock = make()
    tracker.forward_begin(8)
    tracker.optimizer_begin({"grad_norm": NotYet(None), "nonfinite": NotYet(True)})
    tracker.optimizer_end({})
    tracker.flush()
    assert "grad_norm" not in out[0] and out[0]["nonfinite"] is True


def test_phase_follows_the_step():
    tracker, _, _clock = make()
    assert tracker.phase == "startup"
    tracker.forward_begin(1)
    assert tracker.phase == "forward"
    tracker.optimizer_begin({})
    assert tracker.phase == "optimizer"
    tracker.optimizer_end({})
    assert tracker.phase == "data"


def test_the_attempt_is_ddptops_count_then_torchruns(monkeypatch):
    """ddptop's probe numbers attempts for the whole job; without it, torchrun's own count."""
    from ddptop.trainer import monitor

    monkeypatch.delenv(launch_env.ATTEMPT, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert monitor.attempt() == 0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert monitor.attempt() == 1
    monkeypatch.setenv(launch_env.ATTEMPT, "3")  # another node's failure restarted this group too
    assert monitor.attempt() == 3


def test_a_rank_that_stopped_training_has_its_steps_built_by_the_sender_all_but_the_last():
    """Training that stops (a long evaluation, a hang) still has its records
    sent, built on the sender's thread, but for the last step, which a
    monitor.step() may still add to."""
    import threading

    tracker, out, clock = make()
    for _ in range(3):
        run_step(tracker, clock, 0.0, 0.001)
    sender = threading.Thread(target=tracker.build)
    sender.start()
    sender.join()
    assert [r["step"] for r in out] == [0, 1]
    tracker.explicit(loss=0.5, samples=None, tokens=None)
    tracker.flush()
    assert [(r["step"], r.get("loss")) for r in out] == [(0, None), (1, None), (2, 0.5)]


def test_a_rank_that_stopped_training_has_its_last_step_sent_once_it_has_sat_closed_a_while():
    """Rank 0 evaluating alone for minutes, or stuck in its data loader: its last step is sent
    after SEAL_AFTER_S (or two of its own step times), so the dashboard does not show it a step
    behind the ranks that wait for it. A monitor.step() for that step after it went is dropped,
    not given to the next step."""
    tracker, out, clock = make()
    run_step(tracker, clock, 0.0, 0.1)
    run_step(tracker, clock, 0.0, 0.1)
    clock.now += SEAL_AFTER_S - 0.01
    tracker.build()
    assert [r["step"] for r in out] == [0], "a monitor.step() may still come for step 1"
    clock.now += 0.02
    tracker.build()
    assert [r["step"] for r in out] == [0, 1]
    tracker.explicit(loss=9.0, samples=99, tokens=None)
    run_step(tracker, clock, 0.0, 0.1)
    tracker.flush()
    assert [(r["step"], r.get("loss"), r["samples"]) for r in out[1:]] == [(1, None, 8), (2, None, 8)]

    slow, out, clock = make()  # steps of 4 s: two of them before the last is sent
    run_step(slow, clock, 0.0, 4.0)
    clock.now += SEAL_AFTER_S + 1.0
    slow.build()
    assert out == []
    clock.now += 2.0
    slow.build()
    assert [r["step"] for r in out] == [0]

    held, out, clock = make()  # losses held for the next forward (no guard packed them): it waits for them
    backward_step(held, clock, Loss(0.5))
    clock.now += 60.0
    held.build()
    assert out == []
    held.forward_begin(8)
    held.build()
    assert [(r["step"], r["loss"]) for r in out] == [(0, 0.5)]


def test_steps_past_the_journal_bound_are_dropped_and_counted(monkeypatch):
    """A script calling monitor.step() far faster than the sender reads: the oldest entries go,
    and the steps they were part of are counted, the first one read after them included (it may
    have lost its own first entries)."""
    from ddptop.trainer import steps

    monkeypatch.setattr(steps, "MAX_JOURNAL", 8)  # four steps, each closed by monitor.step(): two entries
    tracker, out, _clock = make()
    for _ in range(10):
        tracker.explicit(loss=1.0, samples=None, tokens=None)
    tracker.flush()
    assert tracker.dropped == 7
    assert [r["step"] for r in out] == [7, 8, 9]
    for _ in range(3):  # the journal read, nothing more is lost
        tracker.explicit(loss=1.0, samples=None, tokens=None)
    tracker.flush()
    assert tracker.dropped == 7 and [r["step"] for r in out[3:]] == [10, 11, 12]


def test_a_resume_moves_the_steps_without_counting_a_gap():
    tracker, out, clock = make()
    run_step(tracker, clock, 0.0, 0.1)
    tracker.resumed_at(40)
    run_step(tracker, clock, 0.0, 0.1)
    tracker.flush()
    assert [r["step"] for r in out] == [0, 40] and tracker.dropped == 0
