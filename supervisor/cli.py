"""The `ddptop` command: launch, attach, replay, ls, export.

Bad input is answered with one line on stderr and exit status 2, before
anything is started, so a mistake never leaves a process behind.

With the dashboard, `launch` forks: the child becomes the supervisor in a
session of its own (its output in the run directory's supervisor.log), and
the parent runs the dashboard attached to the child's socket, exactly as
`ddptop attach` would. So quitting the dashboard can leave the job running
headless, and launch and attach are one code path.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import psutil

import ddptop
from ddptop.supervisor import cluster, endpoints, launchargs, remote, rundir
from ddptop.supervisor.launchargs import OneLineParser, UsageError
from ddptop.supervisor.launcher import JobPlan, Torchrun
from ddptop.supervisor.rundir import RunDirError
from ddptop.supervisor.sampler import Sampler, gpu_count, load_nvml, release_nvml
from ddptop.supervisor.supervise import Supervisor
from ddptop.supervisor.watchdog import WatchPolicy
from ddptop.trainer.policy import GuardPolicy
from ddptop.trainer.sender import connect

if TYPE_CHECKING:
    from ddptop.tui.app import DdptopApp

SOCKET_WAIT_S = 30.0

USAGE = """\
usage: ddptop launch [options] SCRIPT [script args]   run a DDP job under torchrun and supervise it
       ddptop attach [RUN | HOST:PORT[,...]]          the dashboard on a running job (default: newest)
       ddptop replay RUN                              the dashboard over a run's recorded events
       ddptop ls [--json]                             list runs and their state
       ddptop export RUN                              print a run's event log as JSON lines

launch options (anywhere before --; the rest goes to the script):
"""


def _launch_help() -> str:
    return USAGE + launchargs.option_parser().format_help().split("\n", 1)[1]


def check_script(script: Path) -> None:
    if not script.is_file():
        raise UsageError(f"no such script: {script}")
    try:
        compile(script.read_bytes(), str(script), "exec")
    except (SyntaxError, ValueError) as exc:
        raise UsageError(f"{script} is not a Python script ({type(exc).__name__}: {exc})") from None


def plan_job(args: launchargs.LaunchArgs, nvml: ModuleType | None, run: rundir.RunDir) -> tuple[JobPlan, list[str]]:
    """Decide ranks and devices from the options and the GPUs this machine has."""
    opts = args.options
    gpus = gpu_count(nvml)
    notices = []
    visible = None
    if opts.gpus is not None:
        nproc = opts.gpus
        if gpus and opts.gpus > gpus:
            raise UsageError(f"--gpus {opts.gpus} asks for more GPUs than this machine has ({gpus})")
        visible = list(range(opts.gpus)) if gpus else None
    else:
        nproc = opts.nproc_per_node or 1
    if not gpus:
        notices.append(f"no CUDA GPU found: starting {nproc} CPU rank{'s' if nproc > 1 else ''} on gloo")
    plan = JobPlan(
        script=args.script,
        script_args=args.script_args,
        nproc_per_node=nproc,
        max_restarts=opts.max_restarts,
        restart_backoff=opts.restart_backoff,
        log_dir=run.logs_path,
        address=f"unix:{run.socket_path}",
        cpu_only=not gpus,
        stacks_dir=run.stacks_path,
        guard=GuardPolicy(on_nan=opts.on_nan, clip_grad=opts.clip_grad, desync_every=opts.desync_every),
        visible_gpus=visible,
        nnodes=opts.nnodes,
        node_rank=opts.node_rank,
        rdzv_endpoint=opts.rdzv_endpoint,
        rdzv_backend=opts.rdzv_backend,
        rdzv_id=opts.rdzv_id,
    )
    return plan, notices


def launch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_launch_help())
        return 0
    args = launchargs.split(argv)
    check_script(args.script)
    prometheus = endpoints.parse(args.options.prometheus, what="--prometheus") if args.options.prometheus else None
    if prometheus is not None:
        endpoints.check_bindable(*prometheus, "Prometheus")
    place = cluster.plan(args.options)
    nvml = load_nvml()
    run = rundir.create(args.script, args.options.run_dir)
    endpoints.write_token(run.token_path, place.token)
    plan, notices = plan_job(args, nvml, run)
    notices += _cluster_notices(place, run)
    for notice in notices:
        print(f"ddptop: {notice}", file=sys.stderr, flush=True)
    me = psutil.Process()
    meta = {
        "id": run.id,
        "script": str(args.script),
        "args": args.script_args,
        "nproc_per_node": plan.nproc_per_node,
        "nnodes": plan.nnodes or "1",
        "node_rank": place.node,
        "listen": place.listen_address,
        "aggregator": place.aggregator_address,
        "prometheus": None if prometheus is None else endpoints.text(*prometheus),
        "host": socket.gethostname(),
        "cpu_only": plan.cpu_only,
        "address": plan.address,
        "started": time.time(),
        "supervisor_pid": os.getpid(),
        "supervisor_started": me.create_time(),
        "state": "running",
        "version": ddptop.__version__,
    }
    run.write_meta(meta)
    dashboard = not args.options.headless and sys.stdout.isatty()
    if dashboard:
        release_nvml(nvml)  # NVML is not fork-safe: the supervisor child opens its own
        if os.fork() != 0:
            place.close()  # the supervisor child holds the sockets now
            return _dashboard_for_launch(run)
        _become_detached_supervisor(run)
        nvml = load_nvml()
        meta.update(supervisor_pid=os.getpid(), supervisor_started=psutil.Process().create_time())
        run.write_meta(meta)
    opts = args.options
    watch = WatchPolicy(
        on_nan=opts.on_nan, on_desync=opts.on_desync, on_hang=opts.on_hang, hang_timeout=opts.hang_timeout,
        crash_loop=opts.crash_loop, crash_loop_window=opts.crash_loop_window,
    )
    supervisor = Supervisor(run, Torchrun(plan), Sampler(nvml), opts.summary_every, watch, place, prometheus)
    for notice in notices:
        supervisor.record({"type": "notice", "wall": time.time(), "text": notice})
    code = asyncio.run(supervisor.main({**meta, "wall": meta["started"]}))
    if dashboard:
        os._exit(code)
    return code


def _cluster_notices(place: cluster.Cluster, run: rundir.RunDir) -> list[str]:
    notices = []
    if place.aggregates:
        notices.append(f"node 0 of {place.nnodes}: the other nodes' supervisors join this one at {place.listen_address}")
    elif place.nnodes > 1:
        notices.append(f"node {place.node} of {place.nnodes}: joined node 0's supervisor at {place.aggregator_address}, which watches the whole job")
    if place.listener is not None:
        notices.append(f"the wire listens on {place.listen_address}; its token is in {run.token_path}")
    return notices


def _become_detached_supervisor(run: rundir.RunDir) -> None:
    """In the forked child: own session, output to the run directory."""
    os.setsid()
    log = os.open(run.path / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)


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
    if choice == "stop":
        print(f"ddptop: stopping the job; run directory {run.path}")
        return 0
    end = app.state.exit
    if end is None:
        print(f"ddptop: the supervisor is gone; see {run.path / 'supervisor.log'}", file=sys.stderr)
        return 1
    return int(end["code"])


def _live_run(spec: str | None) -> rundir.RunDir:
    """The run to attach to: named, or this user's newest running one; checked."""
    if spec is None:
        running = [r for r in rundir.all_runs() if r.state() == "running"]
        if not running:
            raise RunDirError("no running job of yours to attach to (ddptop ls lists runs)")
        run = running[-1]
    else:
        run = rundir.find(spec)
    state = run.state()
    if state != "running":
        raise RunDirError(f"run {run.id} has {'finished' if state == 'finished' else 'failed'}; ddptop replay {run.id} shows it")
    sock = run.socket_path
    if not sock.exists():
        raise RunDirError(f"run {run.id} has no socket; its supervisor is gone")
    if sock.stat().st_uid != os.getuid():
        raise RunDirError(f"the socket of run {run.id} belongs to another user")
    try:
        connect(f"unix:{sock}", timeout=2.0).close()
    except OSError as exc:
        raise RunDirError(f"run {run.id} does not answer on its socket ({exc.strerror}); its supervisor is gone") from None
    return run


def _dashboard(run: rundir.RunDir, mode: str) -> DdptopApp:
    """The dashboard on a run: live for launch and attach, from its log for replay.

    Textual is imported only here, where a dashboard opens: headless stays light.
    """
    from ddptop.tui.app import DdptopApp
    from ddptop.tui.source import LiveSource, ReplaySource

    source = ReplaySource(run) if mode == "replay" else LiveSource(run.socket_path)
    return DdptopApp(source, mode, run.path)


def _run_argument(prog: str, argv: list[str]) -> str:
    parser = OneLineParser(prog=prog)
    parser.add_argument("run", help="run directory, run id or id prefix")
    return parser.parse_args(argv).run


def attach(argv: list[str]) -> int:
    parser = OneLineParser(prog="ddptop attach")
    parser.add_argument("target", nargs="?", help="run directory, run id or id prefix (default: your newest running job), "
                        "or HOST:PORT[,HOST:PORT...] of supervisors that listen on TCP")
    parser.add_argument("--token-file", type=Path, help=f"the run's token for TCP (default: ${endpoints.TOKEN_ENV}, or your own run's)")
    opts = parser.parse_args(argv)
    if opts.target is None or not remote.is_address_list(opts.target):
        _dashboard(_live_run(opts.target), "attach").run()
        return 0
    target, notice = remote.choose(opts.target, opts.token_file)
    if notice is not None:
        print(f"ddptop: {notice}", file=sys.stderr)
    from ddptop.tui.app import DdptopApp
    from ddptop.tui.source import LiveSource

    DdptopApp(LiveSource(tcp=(target.host, target.port), token=target.token), "attach").run()
    return 0


def replay(argv: list[str]) -> int:
    run = rundir.find(_run_argument("ddptop replay", argv))
    if not run.events_path.exists():
        raise RunDirError(f"run {run.id} has no event log")
    _dashboard(run, "replay").run()
    return 0


def list_runs(argv: list[str]) -> int:
    parser = OneLineParser(prog="ddptop ls")
    parser.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    opts = parser.parse_args(argv)
    rows = []
    for run in rundir.all_runs():
        meta = run.read_meta()
        rows.append(
            {
                "id": run.id,
                "script": meta.get("script"),
                "state": run.state(),
                "ranks": meta.get("nproc_per_node"),
                "nnodes": meta.get("nnodes"),
                "started": meta.get("started"),
                "path": str(run.path),
            }
        )
    if opts.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no runs under {rundir.runs_root()}")
        return 0
    print(f"{'ID':<40} {'STATE':<9} {'RANKS':>5}  {'STARTED':<19}  SCRIPT")
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started"] or 0))
        print(f"{row['id']:<40} {row['state']:<9} {row['ranks']!s:>5}  {started:<19}  {row['script']}")
    return 0


def export(argv: list[str]) -> int:
    run = rundir.find(_run_argument("ddptop export", argv))
    out = sys.stdout
    for record in rundir.read_events(run):
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return 0


COMMANDS = {"launch": launch, "attach": attach, "replay": replay, "ls": list_runs, "export": export}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
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
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
