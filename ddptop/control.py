"""`ddptop stop|restart|kill RUN`: a job operated from the shell, as from the dashboard.

Each connects to the run's supervisor as a dashboard does (its Unix socket,
0600, or HOST:PORT with the run's token), sends the same command, then reads
the live records until the command's effect shows: the job's exit record,
the group's restart, the rank's departure. One line says what happened. A
run that has ended, whose supervisor is gone, or that is not this user's is
one line and exit 2, and nothing is sent.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddptop.core import launch_env, rundir, wire
from ddptop.core.rundir import RunDirError
from ddptop.core.usage import OneLineParser
from ddptop.core.wire.stream import SocketFrames
from ddptop.supervisor.cluster import remote
from ddptop.trainer.sender import connect

STOP_WAIT_S = 60.0
"""torchrun's grace for its ranks (10 s), then the supervisor's own end."""
ACT_WAIT_S = 60.0
"""A restart includes torchrun's backoff and every rank starting anew."""
CONNECT_S = 5.0


class Connection:
    """A viewer's connection to one supervisor, without the history: only what happens next
    (with snapshot, the job's state first, as a dashboard gets it: model/snapshot.py)."""

    def __init__(self, sock: socket.socket, name: str, snapshot: bool = False) -> None:
        self.sock, self.name = sock, name
        self._frames = SocketFrames(sock)
        """What the supervisor sent, one reader for every call of until: several records often
        come in one read, and a reader per call would drop those after the one it returned."""
        sock.sendall(wire.encode({"type": "viewer_hello", "history": False, "snapshot": snapshot}))

    def send(self, action: str, rank: int | None = None, ranks: list[int] | None = None, **fields: Any) -> None:
        """A command from the shell: of one rank, of several, or of the job (neither); fields are
        the action's own (a capture's steps)."""
        frame: wire.Frame = {"type": "command", "action": action, "origin": "shell", **fields}
        if rank is not None:
            frame["rank"] = rank
        elif ranks:
            frame["ranks"] = ranks
        self.sock.sendall(wire.encode(frame))

    def until(self, seen: Callable[[wire.Frame], bool], timeout: float) -> wire.Frame | None:
        """The first record seen accepts, or None when the supervisor closed or the time ran out."""
        for frame in self._frames.until(time.monotonic() + timeout):
            if seen(frame):
                return frame
        return None


class LiveRun:
    """A running run, and its supervisor's socket, open."""

    def __init__(self, run: rundir.RunDir, sock: socket.socket) -> None:
        self.run, self.sock = run, sock


def live_run(spec: str | None, what: str) -> LiveRun:
    """The run to act on (attach to, stop...): named, or this user's newest running one;
    it must be running, this user's, and answer on its socket."""
    if spec is None:
        running = [r for r in rundir.all_runs() if r.state() == "running"]
        if not running:
            raise RunDirError(f"no running job of yours to {what} (ddptop ls lists runs)")
        run = running[-1]
    else:
        run = rundir.find(spec)
    state = run.state()
    if state != "running":
        raise RunDirError(f"run {run.id} has {state}: nothing to {what}; ddptop replay {run.id} shows it")
    path = run.socket_path
    if not path.exists():
        raise RunDirError(f"run {run.id} has no socket; its supervisor is gone")
    if path.stat().st_uid != os.getuid():
        raise RunDirError(f"the socket of run {run.id} belongs to another user")
    try:
        return LiveRun(run, connect(f"unix:{path}", timeout=CONNECT_S))
    except PermissionError:
        raise RunDirError(f"the socket of run {run.id} belongs to another user") from None
    except OSError as exc:
        raise RunDirError(f"run {run.id} does not answer on its socket ({exc.strerror}); its supervisor is gone") from None


def open_connection(spec: str | None, token_file: Path | None, what: str, snapshot: bool = False) -> Connection:
    if spec is not None and remote.is_address_list(spec):
        target, _ = remote.choose(spec, token_file)
        sock = socket.create_connection((target.host, target.port), timeout=CONNECT_S)
        sock.sendall(wire.encode({"type": "auth", "token": target.token}))
        return Connection(sock, f"{target.host}:{target.port}", snapshot)
    live = live_run(spec, what)
    return Connection(live.sock, live.run.id, snapshot)


def parser_for(prog: str, what: str) -> argparse.ArgumentParser:
    """The options every command on a running job takes: the run, its token."""
    parser = OneLineParser(prog=prog)
    parser.add_argument(
        "run", nargs="?", help=f"run directory, run id or id prefix, or HOST:PORT (default: your newest running job) to {what}"
    )
    parser.add_argument("--token-file", type=Path, help=f"the run's token for HOST:PORT (default: ${launch_env.TOKEN}, or your own run's)")
    return parser


def rank_options(parser: argparse.ArgumentParser, one: str, several: str) -> None:
    """--rank R | --ranks 0,3 | --all (the default): the ranks a command on a running job asks of."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, help=one)
    which.add_argument("--ranks", type=_rank_list, help=several)
    which.add_argument("--all", action="store_true", help="every rank (the default)")


def _rank_list(text: str) -> list[int]:
    """--ranks 0,3 as a list of ranks."""
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: ranks as 0,3") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: ranks as 0,3")
    return ranks


def stop(argv: list[str]) -> int:
    opts = parser_for("ddptop stop", "stop").parse_args(argv)
    job = open_connection(opts.run, opts.token_file, "stop")
    job.send("stop")
    end = job.until(lambda r: r["type"] == "exit", STOP_WAIT_S)
    if end is None:
        print(f"ddptop: asked run {job.name} to stop; its supervisor closed the connection before the job's end was seen")
        return 0
    print(f"ddptop: stopped run {job.name} (exit {end['code']})")
    return 0


def restart(argv: list[str]) -> int:
    opts = parser_for("ddptop restart", "restart").parse_args(argv)
    job = open_connection(opts.run, opts.token_file, "restart")
    job.send("restart")
    return _after_kill(job, "restarted the worker group of run", None)


def kill(argv: list[str]) -> int:
    parser = parser_for("ddptop kill", "kill a rank of")
    parser.add_argument("--rank", type=int, required=True, help="the rank to kill (SIGKILL); torchrun then restarts the group")
    opts = parser.parse_args(argv)
    job = open_connection(opts.run, opts.token_file, "kill a rank of")
    job.send("kill_rank", opts.rank)
    return _after_kill(job, f"killed rank {opts.rank} of run", opts.rank)


def _after_kill(job: Connection, done: str, rank: int | None) -> int:
    """The group restart that follows a kill, or the job's end when no restart is left."""

    def seen(record: wire.Frame) -> bool:
        return record["type"] in ("group_restart", "exit") or (record["type"] == "notice" and record["text"].startswith("no rank "))

    what = job.until(seen, ACT_WAIT_S)
    if what is None:
        print(f"ddptop: {done} {job.name}; no restart seen within {ACT_WAIT_S:.0f} s")
        return 0
    if what["type"] == "notice":
        raise RunDirError(f"run {job.name}: {what['text']}")
    if what["type"] == "exit":
        print(f"ddptop: {done} {job.name}; no restart was left, so the job ended (exit {what['code']})")
        return 0
    print(f"ddptop: {done} {job.name}; torchrun restarted the group (restart {what['restart']}, {what['remaining']} left)")
    return 0
