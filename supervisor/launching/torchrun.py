"""The torchrun child: its command line, its environment, its lifetime.

torchrun is the engine (rendezvous, rank variables, per-rank log files,
restarts of the worker group); this module only starts it the way ddptop
needs it and makes sure it cannot outlive the supervisor:

- torchrun runs in a session of its own, so a Ctrl-C in the terminal reaches
  the supervisor only, which then stops the job in order;
- torchrun gets the parent-death signal, and each rank sets its own from
  the bootstrap (trainer/runtime.py): if the supervisor is killed outright,
  torchrun dies, and with it every rank.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import importlib.metadata
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil

import ddptop.trainer.bootstrap
from ddptop.core import launch_env
from ddptop.core.model.events import exit_status
from ddptop.core.policy import GuardPolicy
from ddptop.trainer import flightrecorder
from ddptop.trainer.template import MARK

BOOTSTRAP_DIR = str(Path(ddptop.trainer.bootstrap.__file__).parent)
STOP_GRACE_S = 10.0
"""How long torchrun gets to stop its workers after SIGTERM before SIGKILL."""
RESTART_BACKOFF_S = 1.0
"""Seconds before a job's second restart; each later one waits twice the one before."""


@dataclass
class JobPlan:
    """What to run, decided by the CLI from the user's arguments."""

    script: Path
    script_args: list[str]
    nproc_per_node: int
    max_restarts: int
    log_dir: Path
    address: str
    cpu_only: bool
    stacks_dir: Path
    guard: GuardPolicy = field(default_factory=GuardPolicy)
    restart_backoff: float = RESTART_BACKOFF_S
    visible_gpus: list[int] | None = None
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str | None = None
    rdzv_id: str | None = None
    module: bool = False
    """script is a module name, run as `python -m` does."""
    no_python: bool = False
    """script is a program, run without Python."""
    style: str = "torchrun"
    """How the script starts its ranks (launching/style.py): anything but torchrun runs one worker."""
    template: bool = True
    """Fork the workers from a template that has imported torch (trainer/template)."""


PROBE = "import sys; from ddptop.supervisor.launching.torchrun_probe import main; sys.exit(main(sys.argv[1:]))"
"""torchrun's program (`python -c`), as `python -m torch.distributed.run` is run: with the
working folder first on sys.path."""


def command(plan: JobPlan) -> list[str]:
    cmd = [
        sys.executable,
        "-c",
        PROBE,
        "--nproc-per-node",
        str(plan.nproc_per_node),
        "--max-restarts",
        str(plan.max_restarts),
        "--log-dir",
        str(plan.log_dir),
        "--redirects",
        "3",
        "--tee",
        "3",
    ]
    if plan.nnodes is None and plan.rdzv_endpoint is None:
        cmd.append("--standalone")
    # torchrun's own default (static) cannot restart one node's group alone:
    # c10d re-rendezvous can, and it assigns the node ranks itself.
    backend = plan.rdzv_backend or ("c10d" if plan.rdzv_endpoint else None)
    for flag, value in (
        ("--nnodes", plan.nnodes),
        ("--node-rank", plan.node_rank if backend == "static" else None),
        ("--rdzv-endpoint", plan.rdzv_endpoint),
        ("--rdzv-backend", backend),
        ("--rdzv-id", plan.rdzv_id),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    entry = ["-m"] if plan.module else ["--no-python"] if plan.no_python else []
    return [*cmd, *entry, str(plan.script), *plan.script_args]


def environment(plan: JobPlan, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    # The token is the supervisor's secret: the ranks talk to it over its Unix socket only.
    for inherited in ("RANK", "LOCAL_RANK", *launch_env.INHERITED):
        env.pop(inherited, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOTSTRAP_DIR, env.get("PYTHONPATH")) if p)
    env[launch_env.ADDRESS] = plan.address
    env["PYTHONUNBUFFERED"] = "1"
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank${rank}]:"
    # torchrun shares one TCPStore across restarts of the group, and the new
    # ranks then read the old ranks' gloo addresses from it: the restarted
    # group hangs or fails to connect (seen with torch 2.13, plain torchrun
    # too). A store per rendezvous round, torch's own opt-out, restarts clean.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The flight recorder: a stall verdict names the rank whose collectives lag (trainer/flightrecorder.py).
    if not any(name in env for name in flightrecorder.FR_ENV):
        env.update(flightrecorder.env_for(_torch_version()))
    env[launch_env.STACKS_DIR] = str(plan.stacks_dir)
    env[launch_env.LAUNCH_STYLE] = plan.style
    env[launch_env.RESTART_BACKOFF] = str(plan.restart_backoff)
    # The template forks torchrun's workers when each is a rank running this Python on a script
    # or a module: not a script that starts its ranks itself, nor a program (--no-python).
    if plan.template and plan.style == "torchrun" and not plan.no_python:
        env.pop(launch_env.NO_TEMPLATE, None)
    else:
        env[launch_env.NO_TEMPLATE] = "1"
    env.update(plan.guard.to_env())
    if plan.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif plan.visible_gpus is not None and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, plan.visible_gpus))
    return env


def _torch_version() -> str | None:
    """The torch the ranks run (this interpreter's), from its metadata: nothing is imported."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def die_with(supervisor_pid: int) -> None:
    """In the forked child, before exec: SIGKILL when its parent (the supervisor) dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != supervisor_pid:  # it died before the line above
            os._exit(1)


class Torchrun:
    def __init__(self, plan: JobPlan) -> None:
        self.plan = plan
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *command(self.plan),
            env=environment(self.plan),
            start_new_session=True,
            preexec_fn=functools.partial(die_with, os.getpid()),
        )

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def descendants(self) -> set[int]:
        """Pids of every live process under torchrun: the job's own."""
        if self.pid is None:
            return set()
        try:
            return {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
        except psutil.Error:
            return set()

    def workers(self) -> set[int]:
        """Pids of torchrun's own workers: the ranks, or a script that starts its ranks itself.
        Those forked from the template are its children, and the template is none."""
        if self.pid is None:
            return set()
        workers: set[int] = set()
        try:
            for child in psutil.Process(self.pid).children():
                if MARK in " ".join(child.cmdline()):
                    workers |= {p.pid for p in child.children()}
                else:
                    workers.add(child.pid)
        except psutil.Error:
            pass
        return workers

    async def wait(self) -> int:
        """torchrun's exit status, a signal death mapped to 128+N as shells do."""
        assert self.proc is not None
        return exit_status(await self.proc.wait())

    async def stop(self) -> None:
        """SIGTERM (torchrun stops its workers), then SIGKILL after the grace."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
