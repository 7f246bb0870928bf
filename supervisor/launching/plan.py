"""What a launch will start, decided before anything runs: the script, the
ranks and their devices, and what to tell the user about them.

A mistake found here is bad input (UsageError), said in one line with
nothing started.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from ddptop.core import rundir
from ddptop.core.policy import GuardPolicy
from ddptop.core.usage import UsageError
from ddptop.supervisor.cluster.placement import Cluster
from ddptop.supervisor.launching.args import LaunchArgs
from ddptop.supervisor.launching.script_options import module_file
from ddptop.supervisor.launching.style import TORCHRUN, Style
from ddptop.supervisor.launching.torchrun import JobPlan
from ddptop.supervisor.sampler import gpu_count


def check_torch() -> None:
    """torchrun is torch's: a Python without torch cannot start the job, and says so here, not in a traceback.

    Found, not imported: the supervisor never pays for importing torch.
    """
    if importlib.util.find_spec("torch") is None:
        raise UsageError(f"torch is not installed for {sys.executable}; install it first (pip install torch)")


def check_script(script: Path) -> None:
    if script.is_dir():
        raise UsageError(f"{script} is a directory: give the training script in it")
    if not script.is_file():
        raise UsageError(f"no such script: {script}")
    try:
        compile(script.read_bytes(), str(script), "exec")
    except (SyntaxError, ValueError) as exc:
        raise UsageError(f"{script} is not a Python script ({type(exc).__name__}: {exc})") from None


def check_entry(args: LaunchArgs) -> Path | None:
    """Check what the ranks will run; return the Python source to read for its launch style (None: no Python)."""
    if args.no_python:
        if not (args.script.is_file() and os.access(args.script, os.X_OK)) and shutil.which(str(args.script)) is None:
            raise UsageError(f"--no-python {args.script}: no such program (a path, or a command on PATH)")
        return None
    source = module_file(str(args.script)) if args.module else args.script
    check_script(source)
    return source


def style_notice(style: Style, script: Path, gpus: int | None) -> str:
    """How the script is started, said once: per rank by torchrun, or once."""
    devices = f" on {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else ""
    if style.name == "spawn":
        return f"{style.reason}: started once{devices}, its ranks are watched"
    if style.name == "single":
        return (
            f"{style.reason}: started once, one process driving every GPU{devices}; "
            f"DistributedDataParallel is faster (one process per GPU): https://pytorch.org/tutorials/intermediate/ddp_tutorial.html"
        )
    return f"{style.reason}: torchrun starts it once per rank{devices}"


VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def visible_gpus(machine: int, env: Mapping[str, str]) -> int:
    """The GPUs a rank can use: the machine's, or as many as CUDA_VISIBLE_DEVICES names, which a
    shared server's users set to keep to their own. CUDA reads its entries up to the first it
    cannot use (an index out of range, "-1"): those after it are hidden too, and "" hides all."""
    given = env.get(VISIBLE_ENV)
    if given is None:
        return machine
    count = 0
    for entry in given.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")) or (entry.isdigit() and int(entry) < machine):
            count += 1
        else:
            break
    return min(count, machine)


def plan_job(
    args: LaunchArgs, nvml: ModuleType | None, run: rundir.RunDir, style: Style = TORCHRUN, env: Mapping[str, str] = os.environ
) -> tuple[JobPlan, list[str]]:
    """Decide ranks and devices from the options, the script's launch style and the GPUs this
    machine has, as far as CUDA_VISIBLE_DEVICES in env leaves them to it."""
    opts = args.options
    machine = gpu_count(nvml)
    gpus = visible_gpus(machine, env)
    hidden = f"{VISIBLE_ENV}={env.get(VISIBLE_ENV)!r}" if gpus < machine else None
    notices = []
    visible = None
    if opts.gpus is not None:
        nproc = opts.gpus
        if gpus and opts.gpus > gpus:
            raise UsageError(
                f"--gpus {opts.gpus} asks for more GPUs than {hidden} leaves visible ({gpus})"
                if hidden
                else f"--gpus {opts.gpus} asks for more GPUs than this machine has ({gpus})"
            )
        visible = list(range(opts.gpus)) if gpus else None
    else:
        nproc = opts.nproc_per_node or 1
    if style.name != "torchrun" and (opts.nnodes or opts.rdzv_endpoint):
        raise UsageError(f"{args.script} starts its ranks itself (launch style {style.name}): it runs on one node, without --nnodes")
    notices.append(style_notice(style, args.script, opts.gpus if gpus else None))
    if style.name != "torchrun":
        nproc = 1  # the script starts its own ranks, or drives every GPU from one process
    if not gpus:
        what = f"{nproc} CPU rank{'s' if nproc > 1 else ''} on gloo" if style.name == "torchrun" else "it on the CPU"
        notices.append(f"{hidden} hides every GPU: starting {what}" if hidden else f"no CUDA GPU found: starting {what}")
    plan = JobPlan(
        script=args.script.absolute() if args.no_python and args.script.is_file() else args.script,
        script_args=args.script_args,
        module=args.module,
        no_python=args.no_python,
        nproc_per_node=nproc,
        style=style.name,
        template=not opts.no_template,
        max_restarts=opts.max_restarts,
        restart_backoff=opts.restart_backoff,
        log_dir=run.logs_path,
        address=f"unix:{run.socket_path}",
        cpu_only=not gpus,
        stacks_dir=run.raw_stacks_path,
        guard=GuardPolicy(on_nan=opts.on_nan, clip_grad=opts.clip_grad, desync_every=opts.desync_every, bucket_view=opts.bucket_view),
        visible_gpus=visible,
        nnodes=opts.nnodes,
        node_rank=opts.node_rank,
        rdzv_endpoint=opts.rdzv_endpoint,
        rdzv_backend=opts.rdzv_backend,
        rdzv_id=opts.rdzv_id,
    )
    return plan, notices


def cluster_notices(place: Cluster, run: rundir.RunDir) -> list[str]:
    notices = []
    if place.aggregates:
        notices.append(f"node 0 of {place.nnodes}: the other nodes' supervisors join this one at {place.listen_address}")
    elif place.nnodes > 1:
        notices.append(
            f"node {place.node} of {place.nnodes}: joined node 0's supervisor at {place.aggregator_address}, which watches the whole job"
        )
    if place.listener is not None:
        notices.append(f"the wire listens on {place.listen_address}; its token is in {run.token_path}")
    return notices
