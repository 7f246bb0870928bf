"""A restart ddptop caused, for a verdict or at the user's request, says so in its record and its words."""

from __future__ import annotations

from pathlib import Path

from builders import build, hello

from ddptop.core import rundir
from ddptop.core.model.events import restart_text
from ddptop.supervisor.serving.hub import Hub


def restart(node: int, number: int) -> dict:
    """torchrun's record of a restart, naming the rank ddptop killed, with the backoff it waits."""
    return build("group_restart", node=node, restart=number, remaining=3 - number, rank=1, exitcode=-9, backoff_s=1.0)


def test_every_nodes_restart_is_marked_with_the_users_request_until_the_next_attempt_says_hello(tmp_path):
    hub = Hub(rundir.create(Path("train.py"), tmp_path / "run"), lambda command: None)
    seen: list[dict] = []
    hub.observer = seen.append
    hub.record(hello(0, world=2, restart=0))
    hub.stopping_for({"asked": "kill of rank 1 requested from the shell (ddptop kill)"})
    hub.record(hello(1, world=2, restart=0))  # a late hello of the attempt being stopped
    hub.record(restart(0, 1))
    hub.record(restart(1, 1))  # another node's torchrun restarts too
    hub.record(hello(0, world=2, restart=1))
    hub.record(restart(0, 2))  # a failure of the new attempt: torchrun's own words again

    said = [restart_text(r, going=True) for r in seen if r["type"] == "group_restart"]
    asked = "torchrun restarts the worker group (restart 1, 2 left) after the kill of rank 1 requested from the shell (ddptop kill)"
    assert said == [asked, asked, "torchrun restarts the worker group (restart 2, 1 left) after rank 1 was killed by SIGKILL, in 1 s"]


def test_a_restart_for_a_verdict_names_the_alert_and_keeps_its_backoff(tmp_path):
    hub = Hub(rundir.create(Path("train.py"), tmp_path / "run"), lambda command: None)
    seen: list[dict] = []
    hub.observer = seen.append
    hub.record(hello(0, restart=1))
    hub.stopping_for({"ordered": "hang"})
    hub.record(restart(0, 2))
    assert (
        restart_text(seen[-1])
        == "torchrun asks to restart the worker group (restart 2, 1 left) after ddptop stopped it for the hang alert, in 1 s"
    )


def test_a_restart_asked_before_the_new_attempt_s_first_hello_marks_the_next_restart(tmp_path):
    """`ddptop restart` right after torchrun restarted the group: the new attempt's processes run
    (the supervisor kills them) but none has said hello. Its hello, read after the request, is of
    the attempt being stopped, not of the one after it; the restart that follows is the user's."""
    hub = Hub(rundir.create(Path("train.py"), tmp_path / "run"), lambda command: None)
    seen: list[dict] = []
    hub.observer = seen.append
    hub.record(hello(0, restart=0))
    hub.record(restart(0, 1))
    hub.stopping_for({"asked": "restart of the group requested from the shell (ddptop restart)"})
    hub.record(hello(0, restart=1))  # sent before the kill, read after the request
    hub.record(restart(0, 2))
    assert seen[-1].get("asked") == "restart of the group requested from the shell (ddptop restart)", seen[-1]
