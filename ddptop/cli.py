"""The `ddptop` command: launch, attach, replay, ls, export, stop, restart, kill, logs, profile, stacks.

This is where the parts meet: `launch` is the supervisor's
(ddptop.supervisor.launch), and the dashboard it opens, like `attach` and
`replay`, is the TUI's, handed to it from here, so neither part imports the
other. Bad input is answered with one line on stderr and exit status 2,
before anything is started, so a mistake never leaves a process behind.

Each command imports what it needs when it runs: `ddptop ls` or `ddptop
stop` should not pay for the supervisor's imports (a third of a second).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import ddptop
from ddptop.core import launch_env, rundir
from ddptop.core.model.history import unpack
from ddptop.core.rundir import RunDirError
from ddptop.core.usage import OneLineParser, UsageError

if TYPE_CHECKING:
    from ddptop.tui.app import DdptopApp

SOCKET_WAIT_S = 30.0

USAGE = """\
usage: ddptop launch [options] SCRIPT [script args]   run a DDP job under torchrun and supervise it
       ddptop [top]                                   the dashboard on every PyTorch distributed job on this host
       ddptop attach [RUN | HOST:PORT[,...]] [--readonly]   the dashboard on a running job (default: newest)
       ddptop replay RUN                              the dashboard over a run's recorded events
       ddptop ls [--running] [--json]                 list runs, newest last, and how each ended
       ddptop export RUN                              print a run's event log as JSON lines
       ddptop stop [RUN]                              stop a running job (as Ctrl-C in launch does)
       ddptop restart [RUN]                           restart its worker group
       ddptop kill [RUN] --rank R                     kill one rank (torchrun restarts the group)
       ddptop logs [RUN] [--rank R] [--attempt N | --all] [-f]   the ranks' output, across restarts
       ddptop profile [RUN] [--rank R | --ranks 0,3 | --all] [--steps N]   capture N steps of ranks with torch.profiler
       ddptop stacks [RUN] [--rank R | --ranks 0,3 | --all]   every thread of ranks, now (py-spy, native frames)
       ddptop ps [--json]                             every PyTorch distributed job on this host, launched by ddptop or not

launch options (anywhere before --; the rest goes to the script):
"""


def _launch_help() -> str:
    from ddptop.supervisor.launching import args as launchargs

    return USAGE + launchargs.option_parser().format_help().split("\n", 1)[1]


def launch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_launch_help())
        return 0 if argv else 2  # no script given: the usage, and a failure to a shell that chains on it, as bare `ddptop`
    from ddptop.supervisor.launch import launch as supervisor_launch

    return supervisor_launch(argv, _dashboard_for_launch)


def _dashboard_for_launch(run: rundir.RunDir) -> int:
    """The parent after the fork: wait for the supervisor's socket, then attach."""
    deadline = time.monotonic() + SOCKET_WAIT_S
    while not run.socket_path.exists():
        if time.monotonic() > deadline:
            raise RunDirError(f"the supervisor did not start; see {run.path / 'supervisor.log'}")
        time.sleep(0.05)
    app = _dashboard(run, "launch")
    choice = app.run()
    if choice == "leave":
        print(f"ddptop: the job runs on headless; ddptop attach {run.id}")
        return 0
    end = app.state.exit
    if choice == "stop":
        if end is None:  # closed before the end (q again): the job goes on stopping
            print(f"ddptop: stopping the job; run directory {run.path}")
            return 0
        print(f"ddptop: job stopped (exit {end['code']}); run directory {run.path}")
        return int(end["code"])
    if end is None:
        print(f"ddptop: the supervisor is gone; see {run.path / 'supervisor.log'}", file=sys.stderr)
        return 1
    return int(end["code"])


def _attachable(spec: str | None) -> rundir.RunDir:
    from ddptop import control

    live = control.live_run(spec, "attach to")
    live.sock.close()  # it answers: the dashboard opens its own connection
    return live.run


def _dashboard(run: rundir.RunDir, mode: str, readonly: bool = False) -> DdptopApp:
    """The dashboard on a run: live for launch and attach, from its log for replay.

    Textual is imported only here, where a dashboard opens: headless stays light.
    """
    from ddptop.tui.app import DdptopApp
    from ddptop.tui.source import LiveSource, ReplaySource

    source = ReplaySource(run) if mode == "replay" else LiveSource(run.socket_path)
    return DdptopApp(source, mode, run.path, readonly)


def _run_argument(prog: str, argv: list[str]) -> str:
    parser = OneLineParser(prog=prog)
    parser.add_argument("run", help="run directory, run id or id prefix")
    return parser.parse_args(argv).run


def attach(argv: list[str]) -> int:
    from ddptop.supervisor.cluster import remote

    parser = OneLineParser(prog="ddptop attach")
    parser.add_argument(
        "target",
        nargs="?",
        help="run directory, run id or id prefix (default: your newest running job), "
        "or HOST:PORT[,HOST:PORT...] of supervisors that listen on TCP",
    )
    parser.add_argument("--token-file", type=Path, help=f"the run's token for TCP (default: ${launch_env.TOKEN}, or your own run's)")
    parser.add_argument(
        "--readonly", action="store_true", help="watch only: no restart, kill, profile capture or stack dump is offered (as nvitop's)"
    )
    opts = parser.parse_args(argv)
    if opts.target is None or not remote.is_address_list(opts.target):
        _dashboard(_attachable(opts.target), "attach", opts.readonly).run()
        return 0
    target, notice = remote.choose(opts.target, opts.token_file)
    if notice is not None:
        print(f"ddptop: {notice}", file=sys.stderr)
    from ddptop.tui.app import DdptopApp
    from ddptop.tui.source import LiveSource

    DdptopApp(LiveSource(tcp=(target.host, target.port), token=target.token), "attach", readonly=opts.readonly).run()
    return 0


def replay(argv: list[str]) -> int:
    run = rundir.find(_run_argument("ddptop replay", argv))
    if not run.events_path.exists():
        raise RunDirError(f"run {run.id} has no event log")
    _dashboard(run, "replay").run()
    return 0


def export(argv: list[str]) -> int:
    run = rundir.find(_run_argument("ddptop export", argv))
    out = sys.stdout
    for record in rundir.read_events(run):
        out.write(json.dumps(record, separators=(",", ":"), default=_per_rank) + "\n")
    return 0


def _per_rank(value: object) -> list[float | None]:
    """A summary's per-rank values (float32 by rank, model/history.py) as JSON: a number a
    rank, null for a rank that finished no step in that second."""
    if not isinstance(value, bytes):
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return [None if math.isnan(v) else v for v in unpack(value)]


def _command(module: str, name: str, argv: list[str]) -> int:
    """A command of its own module, imported when it runs."""
    function: Callable[[list[str]], int] = getattr(importlib.import_module(module), name)
    return function(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "launch": launch,
    "attach": attach,
    "replay": replay,
    "ls": lambda argv: _command("ddptop.ls", "list_runs", argv),
    "export": export,
    "stop": lambda argv: _command("ddptop.control", "stop", argv),
    "restart": lambda argv: _command("ddptop.control", "restart", argv),
    "kill": lambda argv: _command("ddptop.control", "kill", argv),
    "logs": lambda argv: _command("ddptop.logs", "logs", argv),
    "profile": lambda argv: _command("ddptop.profile", "profile", argv),
    "stacks": lambda argv: _command("ddptop.stacks", "stacks", argv),
    "ps": lambda argv: _command("ddptop.ps", "ps", argv),
    "top": lambda argv: _command("ddptop.top", "top", argv),
}


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, where a closed pipe can still be caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # The reader went away (`ddptop --help | head`): as `head` itself would, stop quietly. Python
        # flushes stdout once more at exit; pointed at /dev/null, that flush has nowhere to fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str]) -> int:
    if not argv and sys.stdin.isatty() and sys.stdout.isatty():  # a person at a terminal: the top of every job
        argv = ["top"]
    if not argv or argv[0] in ("-h", "--help"):
        print(_launch_help())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"ddptop {ddptop.__version__}")
        return 0
    command = COMMANDS.get(argv[0])
    try:
        if command is None:
            raise UsageError(f"unknown command {argv[0]!r} (try: {', '.join(COMMANDS)})")
        return command(argv[1:])
    except (UsageError, RunDirError) as exc:
        print(f"ddptop: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
