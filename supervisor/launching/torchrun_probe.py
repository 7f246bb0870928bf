"""torchrun, with a probe that tells the supervisor what only torchrun knows.

Run where plain torchrun would be (`python -m torch.distributed.run ARGS`): the
same engine in the same process, with its agent's _monitor_workers and
_restart_workers wrapped to report each worker's failure and each restart of
the group, and to hold a restart until the watchdog has judged its failure.
What it reports and why: docs/design.md, "torchrun's probe". A probe that
cannot connect, or a torch whose agent lacks these methods, leaves torchrun
as it is: the reports are extras, the job is the point.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from ddptop.core import launch_env, wire
from ddptop.core.model.events import exit_status
from ddptop.core.wire import records
from ddptop.supervisor.launching import console_tail, oom_kills, template
from ddptop.trainer.sender import connect

SEND_TIMEOUT_S = 1.0
JUDGE_WAIT_S = 5.0
"""How long past its backoff a restart waits for the supervisor's go: a
supervisor that does not answer must not hold the job up for longer."""
MESSAGE_MAX = 4096
BACKOFF_MAX_S = 60.0


def backoff_s(restart: int, base: float) -> float:
    """Wait before restart number `restart` (from 1): none for the first, then base, 2x base..."""
    if restart <= 1 or base <= 0:
        return 0.0
    wait: float = min(base * 2 ** (restart - 2), BACKOFF_MAX_S)
    return wait


class Reporter:
    """A blocking connection from torchrun's monitor loop; rare, small sends."""

    def __init__(self, address: str | None, sock: socket.socket | None = None) -> None:
        """address: the supervisor's socket, connected on the first send; sock: a connection already made."""
        self.address = address
        self.node = int(os.environ.get("GROUP_RANK", "0"))
        self.last_failure: tuple[int, int] | None = None
        """(rank, exit code) of the failure torchrun saw first since the last restart."""
        self.restarts = 0
        """Restarts of this node's group so far: the attempt its ranks run in."""
        self.oom_counter = oom_kills.counter()
        """The OOM kill count of torchrun's memory cgroup, which its workers share."""
        self.oom_seen = oom_kills.count(self.oom_counter)
        """That count when the last failures were reported (at first, before any worker)."""
        self._sock = sock

    def send(self, frame: wire.Record) -> None:
        if self.address is None:
            return
        try:
            if self._sock is None:
                self._sock = connect(self.address, SEND_TIMEOUT_S)
                self._sock.sendall(wire.encode({"type": "agent_hello", "node": self.node}))
            self._sock.sendall(wire.encode(frame))
        except OSError:
            self._sock = None

    def note(self, text: str) -> None:
        """Something the user should know of the launch: said by the supervisor, or here without one."""
        if self.address is None:
            print(f"ddptop: {text}", file=sys.stderr)
        self.send({"type": "agent_note", "node": self.node, "wall": time.time(), "text": text})

    def phase(self, name: str) -> None:
        self.send({"type": "agent_phase", "node": self.node, "restart": self.restarts, "phase": name, "wall": time.time()})

    def hold_restart(self, restart: int, backoff: float) -> None:
        """Wait out the backoff, and until the supervisor says go (at most JUDGE_WAIT_S more).
        A go that says `now` (a restart the user asked for) waives what is left of the backoff.

        A stop signal still interrupts the wait (torchrun's SignalException).
        """
        start = time.monotonic()
        decoder = wire.FrameDecoder()
        go = self._sock is None  # no supervisor to ask
        while not go and (left := start + backoff + JUDGE_WAIT_S - time.monotonic()) > 0:
            assert self._sock is not None
            try:
                self._sock.settimeout(left)
                data = self._sock.recv(4096)
            except TimeoutError:
                break
            except OSError:
                data = b""
            if not data:
                self._sock = None
                break
            try:
                gos = [f for f in decoder.feed(data) if f["type"] == "restart_go" and f.get("restart") == restart]
            except wire.FrameError:
                break
            go = bool(gos)
            if any(f.get("now") for f in gos):
                return
        time.sleep(max(0.0, start + backoff - time.monotonic()))

    def failures(self, result: Any, group_rank: int) -> None:
        if result.failures:
            rank, first = min(result.failures.items(), key=lambda item: item[1].timestamp)
            self.last_failure = (int(rank), int(first.exitcode))
        killed = None
        if (now := oom_kills.count(self.oom_counter)) is not None:
            killed, self.oom_seen = now - (self.oom_seen or 0), now
        for rank, failure in result.failures.items():
            frame: records.WorkerFailure = {
                "type": "worker_failure",
                "node": group_rank,
                "restart": self.restarts,
                "rank": int(rank),
                "local_rank": int(failure.local_rank),
                "pid": int(failure.pid),
                "exitcode": int(failure.exitcode),
                "wall": time.time(),
            }
            message = _message(failure)
            if message:
                frame["message"] = message
            if killed:
                frame["oom_kills"] = killed
            self.send(frame)


def _message(failure: Any) -> str | None:
    """The exception the rank recorded in its error file (the bootstrap writes it), if any."""
    if not failure.error_file or not os.path.isfile(failure.error_file):
        return None
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message")
    return str(message)[:MESSAGE_MAX] if message else None


def install(reporter: Reporter, backoff_base: float) -> None:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    monitor = LocalElasticAgent._monitor_workers
    restart = LocalElasticAgent._restart_workers
    for method, phase in (("_stop_workers", "stopped"), ("_rendezvous", "rendezvous"), ("_start_workers", "started")):
        setattr(LocalElasticAgent, method, _marking(getattr(LocalElasticAgent, method), reporter, phase))

    def _monitor_workers(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if result.is_failed():
            reporter.failures(result, worker_group.group_rank or 0)
        return result

    def _restart_workers(self: Any, worker_group: Any) -> None:
        # Every restart counts, not only this node's failures (torchrun's count):
        # across nodes, a group restarted for another node's failure is one more
        # attempt of the same job, and every node's ranks must say the same number.
        reporter.restarts += 1
        count = reporter.restarts
        wait = backoff_s(count, backoff_base)
        frame: records.GroupRestart = {
            "type": "group_restart",
            "node": worker_group.group_rank or 0,
            "restart": count,
            "remaining": self._remaining_restarts,
            "wall": time.time(),
            "backoff_s": wait,
        }
        if reporter.last_failure is not None:
            frame["rank"], frame["exitcode"] = reporter.last_failure
            reporter.last_failure = None
        reporter.send(frame)
        reporter.hold_restart(count, wait)
        os.environ[launch_env.ATTEMPT] = str(count)  # the new ranks inherit it
        restart(self, worker_group)

    # Patching the agent's class is how the probe sees what torchrun alone knows.
    LocalElasticAgent._monitor_workers = _monitor_workers  # type: ignore[method-assign]
    LocalElasticAgent._restart_workers = _restart_workers  # type: ignore[method-assign]


def redraw_in_place() -> None:
    """torchrun's tee writes a progress bar's redraws as a console does (console_tail.py)."""
    try:
        from torch.distributed.elastic.multiprocessing import tail_log
    except ImportError:  # a torch without it tees nothing to replace
        return
    tail_log.tail_logfile = console_tail.tail_logfile


def _marking(method: Any, reporter: Reporter, phase: str) -> Any:
    """The agent's method, followed by an agent_phase record once it returns."""

    def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        reporter.phase(phase)
        return result

    return marked


def start_template(argv: list[str]) -> template.Template | None:
    """The template for this job's workers, started before torch is imported here so both imports
    overlap; none when the launcher said no (torchrun.environment)."""
    if os.environ.get(launch_env.NO_TEMPLATE):
        return None
    return template.Template.start(template.template_env(argv, dict(os.environ)))


def use_template(forks: template.Template, reporter: Reporter) -> None:
    said = False

    def plain(why: str) -> None:
        nonlocal said
        if not said:
            said = True
            reporter.note(f"ranks start the plain way, without the template: {why}")

    try:
        template.install(forks, plain)
    except (ImportError, AttributeError) as exc:
        plain(f"this torch's worker start cannot be replaced ({exc})")


def main(argv: list[str]) -> int:
    forks = start_template(argv)
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    os.environ[launch_env.AGENT_PID] = str(os.getpid())  # inherited by the ranks: their parent's pid
    os.environ[launch_env.ATTEMPT] = "0"
    reporter = Reporter(os.environ.get(launch_env.ADDRESS))
    try:
        install(reporter, float(os.environ.get(launch_env.RESTART_BACKOFF, "0")))
    except (ImportError, AttributeError) as exc:
        print(f"ddptop: torchrun probe off ({exc}); failures are reported without exit codes", file=sys.stderr)
    if forks is not None:
        use_template(forks, reporter)
    redraw_in_place()
    try:
        parser = run.get_args_parser()
        # The script's own options come after it; torchrun's argparse would take
        # `--start` or `--max` as an abbreviation of its own and stop the launch.
        parser.allow_abbrev = False
        run.run(parser.parse_args(argv))  # type: ignore[no-untyped-call]  # torch's own, untyped
    except ChildFailedError as err:
        _, first = err.get_first_failure()
        return exit_status(first.exitcode) or 1
    except SignalException as exc:  # the supervisor stopped the job: it has said why
        return 128 + int(exc.sigval)
    except Exception as exc:  # torchrun's own failure (its rendezvous, a worker it could not start): said, then raised as ever
        reporter.note(f"{TORCHRUN_FAILED}: {type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}")
        raise
    return 0


TORCHRUN_FAILED = "torchrun failed"
"""How the note of torchrun's own failure begins: the supervisor gives it as the run's why."""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
