"""torchrun's probe holds a restart until the supervisor has judged the failure."""

from __future__ import annotations

import os
import socket
import threading

from ddptop.core import launch_env, wire
from ddptop.supervisor.launching.torchrun_probe import Reporter


def held_restart(restart: int, backoff: float = 0.0) -> tuple[threading.Thread, socket.socket]:
    """A Reporter on one end of a socket pair, holding restart `restart` in a thread."""
    probe_end, supervisor_end = socket.socketpair()
    reporter = Reporter(None, sock=probe_end)
    thread = threading.Thread(target=reporter.hold_restart, args=(restart, backoff), daemon=True)
    thread.start()
    return thread, supervisor_end


def test_a_restart_waits_for_the_go_of_its_own_number():
    thread, supervisor = held_restart(3)
    supervisor.sendall(wire.encode({"type": "restart_go", "restart": 2}))  # an older restart's go
    thread.join(0.5)
    assert thread.is_alive(), "the restart went ahead without its go"
    supervisor.sendall(wire.encode({"type": "restart_go", "restart": 3}))
    thread.join(5.0)
    assert not thread.is_alive()


def test_a_go_for_a_restart_the_user_asked_for_waives_the_backoff():
    plain, plain_supervisor = held_restart(3, backoff=60.0)
    asked, asked_supervisor = held_restart(3, backoff=60.0)
    plain_supervisor.sendall(wire.encode({"type": "restart_go", "restart": 3}))
    asked_supervisor.sendall(wire.encode({"type": "restart_go", "restart": 3, "now": True}))
    asked.join(5.0)
    assert not asked.is_alive()
    assert plain.is_alive(), "a plain go skipped the backoff"


def test_a_supervisor_that_goes_away_does_not_hold_the_restart():
    thread, supervisor = held_restart(1)
    supervisor.close()
    thread.join(5.0)
    assert not thread.is_alive()


def test_without_a_supervisor_only_the_backoff_is_waited():
    reporter = Reporter(None)
    reporter.hold_restart(1, 0.0)


def test_every_restart_is_a_new_attempt_even_for_another_nodes_failure(monkeypatch):
    """torchrun counts only this node's failures; a group restarted because another
    node's failed must still start its ranks on the job's next attempt number."""
    from types import SimpleNamespace

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from ddptop.supervisor.launching import torchrun_probe

    started: list[str] = []
    monkeypatch.setattr(LocalElasticAgent, "_restart_workers", lambda self, group: started.append(os.environ[launch_env.ATTEMPT]))
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, group: None)
    monkeypatch.setenv(launch_env.ATTEMPT, "0")
    reporter = Reporter(None)
    sent: list[wire.Frame] = []
    reporter.send = sent.append
    torchrun_probe.install(reporter, backoff_base=0.0)
    agent = SimpleNamespace(_remaining_restarts=3)  # membership changes leave torchrun's budget alone
    group = SimpleNamespace(spec=SimpleNamespace(max_restarts=3), group_rank=0)
    reporter.last_failure = (2, -9)
    LocalElasticAgent._restart_workers(agent, group)
    LocalElasticAgent._restart_workers(agent, group)
    assert started == ["1", "2"]
    assert [(f["restart"], f.get("rank")) for f in sent] == [(1, 2), (2, None)]  # a failure names one restart only
