"""The template process: import torch once, then fork a child per rank.

Started by torchrun's probe as `python -u -c "...server.main()"`. It waits
on its channel (requests) and on one pidfd per live child (exits), so it
costs nothing between restarts. In a forked child serve() returns the
request, and main() runs the script in that child (child.py).

A child that exits is told to the probe at once but reaped only when the
probe says it heard (`reap`): until then it is a zombie, as a worker that
torchrun's own Popen started stays until torchrun polls it. torchrun stops
the workers it has not seen exit with os.killpg(pid), which finds a
zombie's group but fails (ESRCH) on a reaped one, and that failure ends
torchrun.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Iterable
from typing import NoReturn

from ddptop.core import launch_env
from ddptop.trainer.runtime import die_with_parent
from ddptop.trainer.template import channel, child, fit, proctitle
from ddptop.trainer.template.child import Request

WARM = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.nn.parallel",
    "torch.utils.data",
    "torch.multiprocessing",
    "ddptop.trainer.hooks",
)
"""What every rank would import: the forked ranks find it imported. DDP's
constructor imports torch._dynamo (2 s on a CPU box, as long as torch). The
hooks module is imported but not installed (that is the rank's, once it
knows who it is)."""


def main() -> None:
    request = serve()
    child.become(request)
    child.run(request)


def serve() -> Request:
    """Answer the probe's requests until it goes; returns only in a forked child."""
    proctitle.set_title(sys.orig_argv[:4])  # its own command, without the room it keeps for its children's
    ctl = socket.socket(fileno=int(os.environ.pop(launch_env.TEMPLATE_FD)))
    die_with_parent(launch_env.TEMPLATE_PARENT)
    os.environ.pop(launch_env.TEMPLATE_PARENT)
    start_up = {name.partition(".")[0] for name in sys.modules}
    template_env = dict(os.environ)
    blocker = warm()
    imported = {name.partition(".")[0] for name in sys.modules} - start_up
    set_by_imports = {name: value for name, value in os.environ.items() if template_env.get(name) != value}
    """What the imports put in the environment (torch._dynamo: TORCHINDUCTOR_CACHE_DIR),
    as they would have in a rank that imported them itself."""
    children: dict[int, int] = {}
    """pidfd -> pid of each live child."""
    exited: dict[int, int] = {}
    """pid -> pidfd of each child that exited, a zombie until the probe has heard (see above)."""
    while True:
        ready, _, _ = select.select([ctl.fileno(), *children], [], [])
        for fd in ready:
            if fd in children:
                pid = children.pop(fd)
                exited[pid] = fd
                status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                assert status is not None  # without WNOHANG it returns the exit its pidfd told of
                channel.send(ctl, {"exited": pid, "returncode": _returncode(status)})
                continue
            got = channel.receive(ctl)
            if got is None:
                _end(children)
            message, fds = got
            if "reap" in message:
                reaped = int(message["reap"])
                if (pidfd := exited.pop(reaped, None)) is not None:
                    os.waitpid(reaped, 0)
                    os.close(pidfd)
                continue
            request = Request(list(message["argv"]), dict(message["env"]), str(message["cwd"]), fds, os.getpid())
            why = blocker or fit.misfit(request.argv, request.env, request.cwd, template_env, imported)
            request.env = {**set_by_imports, **request.env}
            if why is not None:
                _close_all(fds)
                channel.send(ctl, {"id": message["id"], "plain": why})
                continue
            pid = os.fork()
            if pid == 0:
                ctl.close()
                _close_all([*children, *exited.values()])
                return request
            _close_all(fds)
            children[os.pidfd_open(pid)] = pid
            channel.send(ctl, {"id": message["id"], "pid": pid})


def warm() -> str | None:
    """Import what every rank would; the reason the template cannot fork, if one arose."""
    try:
        for name in WARM:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - the ranks then start plain, and fail (or not) on their own
        return f"the template could not import {name}: {exc}"
    import torch

    import ddptop.trainer.bootstrap

    bootstrap = getattr(sys.modules.get("sitecustomize"), "__file__", None) or ""
    if os.path.dirname(os.path.abspath(bootstrap)) != os.path.abspath(ddptop.trainer.bootstrap.__path__[0]):
        return f"ddptop's bootstrap is not the sitecustomize this Python ran ({bootstrap or 'none'})"
    if torch.cuda.is_initialized():
        return "CUDA was initialised while Python started (a sitecustomize or .pth file): a fork would share its context"
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.current_thread())
        return f"a thread was started while Python started ({names}): a fork would copy it stopped"
    return None


def _returncode(status: os.waitid_result) -> int:
    """A child's exit status as Popen.returncode gives it: its code, or minus the signal that ended it."""
    return status.si_status if status.si_code == os.CLD_EXITED else -status.si_status


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        os.close(fd)


def _end(children: dict[int, int]) -> NoReturn:
    """The probe is gone (torchrun has ended): no child of ours outlives it."""
    for pid in children.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    sys.exit(0)
