"""`ddptop launch`: plan the job, then supervise it, headless or under a dashboard.

With the dashboard, `launch` forks: the child becomes the supervisor in a
session of its own (its output in the run directory's supervisor.log), and
the parent runs the dashboard attached to the child's socket, exactly as
`ddptop attach` would. So quitting the dashboard can leave the job running
headless, and launch and attach are one code path. The dashboard is handed
in by the caller (ddptop.cli): the supervisor never imports the TUI.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

import ddptop
from ddptop.core import rundir
from ddptop.core.policy import Started, WatchPolicy
from ddptop.supervisor.cluster import endpoints, slurm
from ddptop.supervisor.cluster import placement as cluster
from ddptop.supervisor.launching import args as launchargs
from ddptop.supervisor.launching.plan import check_entry, check_torch, cluster_notices, plan_job
from ddptop.supervisor.launching.style import TORCHRUN, chosen
from ddptop.supervisor.launching.torchrun import Torchrun
from ddptop.supervisor.outlets import Outlets
from ddptop.supervisor.sampler import Sampler, load_nvml, release_nvml

Dashboard = Callable[[rundir.RunDir], int]
"""Runs the dashboard on the run whose supervisor this process forked; returns the exit status."""


def launch(argv: list[str], dashboard: Dashboard) -> int:
    """`ddptop launch ARGV`: the job to its end, headless or under dashboard."""
    args = launchargs.split(argv)
    check_torch()
    source = check_entry(args)
    style = chosen(source, args.options.launch_style) if source is not None else TORCHRUN
    prometheus = endpoints.parse(args.options.prometheus, what="--prometheus") if args.options.prometheus else None
    if prometheus is not None:
        endpoints.check_bindable(*prometheus, "Prometheus")
    from_slurm = None
    if style.name == "torchrun":
        args.options, from_slurm = slurm.apply(args.options, os.environ)
    place = cluster.plan(args.options)
    nvml = load_nvml()
    run = rundir.create(Path(args.script.name.rsplit(".", 1)[-1]) if args.module else args.script, args.options.run_dir)
    outlets = Outlets()
    outlets.write("the token file", endpoints.write_token, run.token_path, place.token)
    plan, notices = plan_job(args, nvml, run, style)
    notices = ([args.notice] if args.notice else []) + notices + ([from_slurm] if from_slurm else []) + cluster_notices(place, run)
    for notice in notices:
        outlets.line(sys.stderr, f"ddptop: {notice}")
    me = psutil.Process()
    meta = {
        "id": run.id,
        "script": args.entry,
        "args": args.script_args,
        "nproc_per_node": plan.nproc_per_node,
        "launch_style": style.name,
        "launch_reason": style.reason,
        "port_set_at": style.port_set_at,
        "nnodes": plan.nnodes or "1",
        "node_rank": place.node,
        "listen": place.listen_address,
        "aggregator": place.aggregator_address,
        "prometheus": None if prometheus is None else endpoints.text(*prometheus),
        "host": socket.gethostname(),
        "cpu_only": plan.cpu_only,
        "gpus": args.options.gpus,
        "address": plan.address,
        "started": time.time(),
        "supervisor_pid": os.getpid(),
        "supervisor_started": me.create_time(),
        "state": "running",
        "version": ddptop.__version__,
    }
    outlets.write("meta.json", run.write_meta, meta)
    with_dashboard = not args.options.headless and sys.stdout.isatty()
    if with_dashboard:
        release_nvml(nvml)  # NVML is not fork-safe: the supervisor child opens its own
        if os.fork() != 0:
            place.close()  # the supervisor child holds the sockets now
            return dashboard(run)
        _become_detached_supervisor(run)
        nvml = load_nvml()
        meta.update(supervisor_pid=os.getpid(), supervisor_started=psutil.Process().create_time())
        outlets.write("meta.json", run.write_meta, meta)
    opts = args.options
    watch = WatchPolicy(
        on_nan=opts.on_nan,
        on_desync=opts.on_desync,
        on_hang=opts.on_hang,
        hang_timeout=opts.hang_timeout,
        crash_loop=opts.crash_loop,
        crash_loop_window=opts.crash_loop_window,
        no_progress=opts.no_progress,
        started=Started(style.name, args.script.name if source is None else source.name, opts.gpus, style.port_set_at),
    )

    def warn(text: str) -> None:
        outlets.line(sys.stderr, f"ddptop: {text}")

    # Imported once the command line has passed its checks: a mistyped flag is said in a
    # fraction of the time the supervisor's own imports (asyncio, Prometheus, the watchdog) take.
    from ddptop.supervisor.supervise import Supervisor

    sampler = Sampler(nvml, warn)
    supervisor = Supervisor(run, Torchrun(plan), sampler, opts.summary_every, watch, place, prometheus, outlets=outlets)
    for notice in notices:
        supervisor.record({"type": "notice", "wall": time.time(), "text": notice})
    code = asyncio.run(supervisor.main({**meta, "wall": meta["started"]}))
    if with_dashboard:
        os._exit(code)
    return code


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
