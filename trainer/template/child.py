"""In a child forked from the template: become the rank torchrun asked for.

What the rank sees is what `python -u SCRIPT ARGS` under torchrun would
show it: a process of its own in a session of its own (torchrun signals
the session's process group), torchrun's log files as stdout and stderr,
torchrun's environment for it, its working folder, `sys.argv`, `sys.path`
with the script's folder first, and the script run as a fresh `__main__`
module with an absolute `__file__`. An exception the script does not catch
is printed by sys.excepthook from the script's own frames and ends the
process with 1, as the interpreter does.
"""

from __future__ import annotations

import builtins
import os
import runpy
import sys
import types
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader

from ddptop.core import launch_env
from ddptop.trainer.runtime import die_with_parent
from ddptop.trainer.template import fit, proctitle


@dataclass
class Request:
    """A rank to become: torchrun's command line, environment and folder, and its stdio."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]
    template: int
    """The template's pid, taken before the fork: the child's parent for as long as the template lives."""


def become(request: Request) -> None:
    """Everything but running the script: the process, its stdio, its environment."""
    os.setsid()
    proctitle.set_title(request.argv)
    for target, fd in enumerate(request.fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    # Its parent is the template, not torchrun. Not os.getppid(): a template killed since the fork
    # would leave 1 there, which the check would take for a live parent and the rank run orphaned.
    os.environ[launch_env.AGENT_PID] = str(request.template)
    die_with_parent(launch_env.AGENT_PID)
    _reseed()
    _start_ddptop()


def run(request: Request) -> None:
    """Run the script, or the module, as the interpreter runs a main program."""
    found = fit.command(request.argv)
    assert found is not None  # fit.misfit let it through
    sys.orig_argv = list(request.argv)
    if not getattr(sys.flags, "safe_path", False):  # `-c` put the working folder first (3.11: unless -P); a script has its own there
        sys.path[0] = found.folder(request.cwd)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    if found.module:
        sys.argv = ["-m", *found.args]
        runpy._run_module_as_main(found.target, alter_argv=True)  # type: ignore[attr-defined]
        return
    path = os.path.abspath(found.target)
    sys.argv = [found.target, *found.args]
    main.__file__ = path
    main.__loader__ = SourceFileLoader("__main__", path)
    try:
        with open(path, "rb") as source:
            code = compile(source.read(), path, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - the interpreter's own handling of an uncaught exception
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_globals is not main.__dict__:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc, tb)
        raise SystemExit(1) from None


def _reseed() -> None:
    """Generators seeded when the template imported them would give every rank the same
    numbers: the same initial weights of a model the script does not seed (which FSDP and
    tensor parallelism never broadcast), the same dropout and augmentations. A rank started
    plain seeds its own, torch's CPU generator from the OS (its GPU ones from a constant, which
    the template never touches); Python's `random` reseeds at fork itself."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _start_ddptop() -> None:
    """What ddptop's bootstrap does at a rank's start-up, now that this is one (the template is none)."""
    bootstrap = sys.modules.get("sitecustomize")
    start = getattr(bootstrap, "start", None)
    if start is not None:
        start()
