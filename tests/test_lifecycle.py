"""The supervised job's lifecycle: its phase, how a stop is asked and how the job ended, and the
restarts that wait; and the supervisor's tables of commands and records."""

from __future__ import annotations

import signal
import typing

import pytest

from ddptop.core.wire import records
from ddptop.supervisor import supervise
from ddptop.supervisor.lifecycle import Lifecycle, Outcome, Phase, RestartGate


def running() -> Lifecycle:
    lifecycle = Lifecycle()
    lifecycle.started()
    return lifecycle


def test_a_job_goes_from_starting_to_running_to_ended_and_says_how_it_ended():
    lifecycle = Lifecycle()
    assert lifecycle.phase is Phase.STARTING and not lifecycle.stopping
    lifecycle.started()
    assert lifecycle.phase is Phase.RUNNING
    with pytest.raises(RuntimeError, match="the job is running, not starting"):
        lifecycle.started()
    assert lifecycle.end(0) == Outcome("finished", 0, None) and lifecycle.phase is Phase.ENDED
    assert running().end(1) == Outcome("failed", 1, None)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_job_the_user_stopped_is_stopped_with_128_plus_the_signal_whatever_torchrun_said(signum, code):
    lifecycle = running()
    assert lifecycle.stop(signum) and lifecycle.phase is Phase.STOPPING and lifecycle.stopping
    assert not lifecycle.stop(signal.SIGTERM), "a second ask kills torchrun, it does not stop it again"
    assert lifecycle.end(-15) == Outcome("stopped", code, signum)


def test_a_job_the_watchdog_stopped_failed_with_the_watchdog_s_status_even_while_the_user_stopped_it():
    lifecycle = running()
    assert lifecycle.stop(signal.SIGTERM, 3)
    assert lifecycle.end(-15) == Outcome("failed", 3, None)
    user_first = running()
    assert user_first.stop(signal.SIGINT) and not user_first.stop(signal.SIGTERM, 4)
    assert user_first.end(130) == Outcome("failed", 4, None)


def test_a_failed_job_is_explained_by_the_verdict_that_stopped_it_else_its_first_crash_else_torchrun():
    lifecycle = running()
    assert lifecycle.failed_why(1, any_rank=False) == "torchrun exited with status 1 before any rank started"
    lifecycle.torchrun_failed = "torchrun failed: the rendezvous timed out"
    assert lifecycle.failed_why(1, any_rank=True) == "torchrun failed: the rendezvous timed out"
    lifecycle.explained_by("crash: rank 1 was killed by SIGKILL", stops=False)
    lifecycle.explained_by("crash: rank 0 failed with exit code 1", stops=False)
    assert lifecycle.failed_why(1, any_rank=True) == "crash: rank 1 was killed by SIGKILL"
    lifecycle.explained_by("crash-loop: the same failure 3 times", stops=True)
    assert lifecycle.failed_why(1, any_rank=True) == "crash-loop: the same failure 3 times"


def test_restarts_wait_at_the_gate_until_released_and_one_asked_between_attempts_until_a_rank_is_up():
    gate = RestartGate()
    first = {"type": "group_restart", "node": 0, "restart": 1, "remaining": 2, "wall": 0.0}
    second = {**first, "node": 1}
    gate.hold(first)
    gate.hold(second)
    assert gate.release() == [first, second] and gate.release() == [] and gate.held == []
    assert gate.up() is None
    gate.ask_when_up("restart of the group requested from the shell (ddptop restart)")
    assert gate.up() == "restart of the group requested from the shell (ddptop restart)"
    assert gate.up() is None, "carried out once"


def test_every_command_a_dashboard_may_send_has_one_handler_and_the_record_tables_name_record_kinds():
    assert set(supervise.COMMANDS) == set(typing.get_args(records.CommandAction))
    kinds = set(typing.get_args(records.RecordKind))
    assert kinds == set(records.RECORDS)
    assert set(supervise.SEEN) <= kinds and set(supervise.JUDGED) <= kinds


async def test_a_supervisor_s_commands_move_its_lifecycle(tmp_path, ddptop_home):
    """A real supervisor of a job not started: `ddptop stop` asks a stop once (the second ask would
    kill torchrun), a restart between attempts waits for the group, and each is said in the log."""
    from pathlib import Path

    from ddptop.core import rundir
    from ddptop.supervisor.launching.torchrun import JobPlan, Torchrun
    from ddptop.supervisor.sampler import Sampler

    run = rundir.create(Path("train.py"), tmp_path / "run")
    plan = JobPlan(Path("train.py"), [], 2, 0, run.path / "logs", str(run.socket_path), True, run.stacks_path)
    supervisor = supervise.Supervisor(run, Torchrun(plan), Sampler(None, lambda text: None), 5.0)
    supervisor.lifecycle.started()
    supervisor.on_command({"type": "command", "action": "restart", "origin": "shell"})
    assert supervisor.restarts.asked == "restart of the group requested from the shell (ddptop restart)"
    supervisor.on_command({"type": "command", "action": "kill_rank", "rank": 7})
    supervisor.on_command({"type": "command", "action": "stop", "origin": "shell"})
    assert supervisor.lifecycle.phase is Phase.STOPPING
    said = [e.get("text") for e in supervisor.state.events]
    assert "no rank 7 in this job (ranks: none yet)" in said and "stop requested from the shell (ddptop stop)" in said
    await supervisor._stopping  # torchrun was never started: nothing to stop
