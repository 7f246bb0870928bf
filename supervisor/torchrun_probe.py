"""torchrun, with a probe that tells the supervisor what only torchrun knows.

The launcher runs `python -m ddptop.supervisor.torchrun_probe ARGS` where
plain torchrun would be `python -m torch.distributed.run ARGS`: the same
engine, in the same process, with two of its agent's methods wrapped:

- `_monitor_workers`: when a worker fails, torchrun is the only process that
  sees its exit code or signal (it is the workers' parent); each failure is
  sent to the supervisor as a `worker_failure` record;
- `_restart_workers`: each restart of the worker group is a `group_restart`
  record with the count.

And one change at the end: a failed job ends with the first failing rank's
exit status (128+N for a signal), and a stopped one with 128+N of the stop
signal, instead of torchrun's traceback and its 1: the supervisor has
already said what failed.

A probe that cannot connect, or a torch whose agent lacks these methods,
leaves torchrun as it is: the reports are extras, the job is the point.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from ddptop.supervisor.launcher import exit_status
from ddptop.trainer import wire
from ddptop.trainer.sender import connect

SEND_TIMEOUT_S = 1.0
MESSAGE_MAX = 4096


class Reporter:
    """A blocking connection from torchrun's monitor loop; rare, small sends."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.node = int(os.environ.get("GROUP_RANK", "0"))
        self._sock: socket.socket | None = None

    def send(self, frame: wire.Frame) -> None:
        if self.address is None:
            return
        try:
            if self._sock is None:
                self._sock = connect(self.address, SEND_TIMEOUT_S)
                self._sock.sendall(wire.encode({"type": "agent_hello", "node": self.node}))
            self._sock.sendall(wire.encode(frame))
        except OSError:
            self._sock = None

    def failures(self, result: Any, group_rank: int) -> None:
        for rank, failure in result.failures.items():
            frame: wire.Frame = {
                "type": "worker_failure",
                "node": group_rank,
                "rank": int(rank),
                "local_rank": int(failure.local_rank),
                "pid": int(failure.pid),
                "exitcode": int(failure.exitcode),
                "wall": time.time(),
            }
            message = _message(failure)
            if message:
                frame["message"] = message
            self.send(frame)


def _message(failure: Any) -> str | None:
    """The exception the rank recorded in its error file (the bootstrap writes it), if any."""
    if not failure.error_file or not os.path.isfile(failure.error_file):
        return None
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message")
    return str(message)[:MESSAGE_MAX] if message else None


def install(reporter: Reporter) -> None:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    monitor = LocalElasticAgent._monitor_workers
    restart = LocalElasticAgent._restart_workers

    def _monitor_workers(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if result.is_failed():
            reporter.failures(result, worker_group.group_rank or 0)
        return result

    def _restart_workers(self: Any, worker_group: Any) -> None:
        spec = worker_group.spec
        reporter.send(
            {
                "type": "group_restart",
                "node": worker_group.group_rank or 0,
                "restart": spec.max_restarts - self._remaining_restarts,
                "remaining": self._remaining_restarts,
                "wall": time.time(),
            }
        )
        restart(self, worker_group)

    LocalElasticAgent._monitor_workers = _monitor_workers
    LocalElasticAgent._restart_workers = _restart_workers


def main(argv: list[str]) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    reporter = Reporter(os.environ.get("DDPTOP_ADDRESS"))
    try:
        install(reporter)
    except (ImportError, AttributeError) as exc:
        print(f"ddptop: torchrun probe off ({exc}); failures are reported without exit codes", file=sys.stderr)
    try:
        run.run(run.parse_args(argv))
    except ChildFailedError as err:
        _, first = err.get_first_failure()
        return exit_status(first.exitcode) or 1
    except SignalException as exc:  # the supervisor stopped the job: it has said why
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
