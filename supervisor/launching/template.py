"""torchrun's side of the template (trainer/template): start it, start ranks from it.

The probe starts the template before it imports torch itself, so the two
imports overlap at launch, and then replaces the last step of torchrun's
worker start, SubprocessHandler._popen: a worker is asked of the template,
and torchrun gets back a Popen-like handle on the forked rank. A worker the
template cannot start exactly as torchrun would is started by torchrun's
own Popen, and the reason is said once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from ddptop.core import launch_env
from ddptop.trainer.template import MARK, channel, proctitle

FORK_WAIT_S = 120.0
"""How long a worker's start waits for the template's answer: the first waits
for its import of torch, which a slow shared file system can make long."""

REAP_SEND_S = 5.0
"""How long telling the template to reap a child may wait: the template reads at once, so
only a template that is stuck makes it wait at all."""

ENTRY = f"from {MARK}.server import main; main()"
"""The template's program (`python -u -c`); each rank it forks puts its script's folder first
on sys.path in place of the working folder `-c` put there, as Python starts a script."""


class Forked:
    """A rank the template forked, with what torchrun uses of a Popen: pid, poll, wait, signals.

    torchrun stops a worker with os.killpg(pid): the rank leads a session of
    its own, as a worker torchrun starts does.
    """

    def __init__(self, template: Template, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._template = template

    def poll(self) -> int | None:
        if self.returncode is None:
            self._template.pump(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._template.pump(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Template:
    """The template process and its channel, used from torchrun's agent thread."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: Any) -> None:
        self.proc = proc
        self._sock = sock
        self._lock = threading.RLock()
        self._next = 0
        self._replies: dict[int, channel.Message] = {}
        self._children: dict[int, Forked] = {}
        self.gone: str | None = None
        """Why the template can serve no more workers, once it cannot."""

    @classmethod
    def start(cls, env: dict[str, str]) -> Template:
        mine, theirs = channel.pair()
        env = {**env, launch_env.TEMPLATE_FD: str(theirs.fileno()), launch_env.TEMPLATE_PARENT: str(os.getpid())}
        room = " " * proctitle.ROOM  # an argument with no effect: the room its children's titles are written in
        command = [sys.executable, "-u", "-c", ENTRY, room]
        proc = subprocess.Popen(command, env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        return cls(proc, mine)

    def fork(self, argv: Sequence[str], env: dict[str, str], stdio: Sequence[int]) -> Forked | str:
        """A worker forked from the template, or why it must start the plain way."""
        with self._lock:
            if self.gone is not None:
                return self.gone
            ident, self._next = self._next, self._next + 1
            try:
                channel.send(self._sock, {"id": ident, "argv": list(argv), "env": env, "cwd": os.getcwd()}, stdio)
            except OSError as exc:
                return self._lose(f"the template is gone ({exc})")
            deadline = time.monotonic() + FORK_WAIT_S
            while ident not in self._replies and self.gone is None:
                if (left := deadline - time.monotonic()) <= 0:
                    return self._lose(f"the template did not answer in {FORK_WAIT_S:.0f} s")
                self.pump(left)
            reply = self._replies.pop(ident, None)
            if reply is None:
                return self.gone or "the template is gone"
            if "plain" in reply:
                return str(reply["plain"])
            forked = Forked(self, int(reply["pid"]), argv)
            self._children[forked.pid] = forked
            return forked

    def pump(self, timeout: float | None) -> None:
        """Read what the template says within timeout (answers, exits), then what else it has said."""
        with self._lock:
            while self.gone is None:
                try:
                    self._sock.settimeout(timeout)
                    got = channel.receive(self._sock)
                except (TimeoutError, BlockingIOError):
                    return
                except OSError as exc:
                    got = None
                    self.gone = f"the template is gone ({exc})"
                if got is None:
                    self._lose(self.gone or f"the template ended ({self.proc.poll()})")
                    return
                message, fds = got
                for fd in fds:
                    os.close(fd)
                if "exited" in message:
                    self._heard_exit(int(message["exited"]), int(message["returncode"]))
                elif "id" in message:
                    self._replies[int(message["id"])] = message
                timeout = 0.0

    def _heard_exit(self, pid: int, returncode: int) -> None:
        """A child exited: its returncode for torchrun, and the template may reap it now (it kept it
        a zombie so far, so that torchrun's os.killpg of a worker it has not seen exit finds it)."""
        if (child := self._children.pop(pid, None)) is not None:
            child.returncode = returncode
        try:
            self._sock.settimeout(REAP_SEND_S)  # pump() may have left it non-blocking
            channel.send(self._sock, {"reap": pid})
        except OSError as exc:
            self._lose(f"the template is gone ({exc})")

    def _lose(self, why: str) -> str:
        """The template cannot go on: its ranks died with it (each has its parent-death signal)."""
        self.gone = why
        for child in self._children.values():
            child.returncode = -signal.SIGKILL
        self._children.clear()
        self.proc.kill()
        return why


def install(template: Template, plain: Callable[[str], None]) -> None:
    """Start torchrun's workers from the template; plain(why) for one it cannot start."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

    original = SubprocessHandler._popen

    def _popen(handler: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        forked = template.fork(args, env, [0, _fd(handler._stdout, 1), _fd(handler._stderr, 2)])
        if isinstance(forked, str):
            plain(forked)
            return original(handler, args, env)
        return forked

    SubprocessHandler._popen = _popen  # type: ignore[method-assign,assignment]


def _fd(stream: IO[str] | None, inherited: int) -> int:
    """The descriptor torchrun's Popen would give the worker: its log file, else torchrun's own."""
    return inherited if stream is None else stream.fileno()


def template_env(argv: Sequence[str], env: dict[str, str]) -> dict[str, str]:
    """The environment torchrun's workers will start with, as far as it is known before torchrun runs:
    torchrun sets OMP_NUM_THREADS=1 for several workers a node when it is not set (a worker
    whose environment still differs where it matters starts plain: trainer/template/fit.py)."""
    env = dict(env)
    nproc = _option(argv, "--nproc-per-node", "--nproc_per_node")
    if "OMP_NUM_THREADS" not in env and nproc is not None and nproc.isdigit() and int(nproc) > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env


def _option(argv: Sequence[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None
