"""`srun ddptop launch train.py --gpus 8`: a job's nodes from the variables SLURM sets.

srun starts one ddptop per node with the same command line; each reads its
place from SLURM, as torchrun users otherwise spell out by hand:

- nodes: SLURM_JOB_NUM_NODES (SLURM_NNODES), this node: SLURM_NODEID;
- the rendezvous: MASTER_ADDR:MASTER_PORT when the batch script set them,
  else the first host of SLURM_JOB_NODELIST (a hostlist expression such as
  `gpu[01-04,07]`, expanded by python-hostlist, SLURM's own syntax) at a port
  derived from the job id, the same on every node; the other nodes join
  node 0's supervisor at that port + 1 (placement.py);
- the rendezvous id: SLURM_JOB_ID; the token: DDPTOP_TOKEN, which srun passes on.

An option given on the command line wins over the variable. Variables that
contradict each other are bad input: one line, nothing started. A job of one
node, or a script that starts its own ranks, runs on its node alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol, TypeVar

import hostlist

from ddptop.core.usage import UsageError

PORT_BASE = 20000
PORT_SPAN = 10000
"""Derived rendezvous ports: even ports from PORT_BASE, so that the aggregator's (+1) is the job's too."""


def derived_port(job_id: int) -> int:
    return PORT_BASE + 2 * (job_id % PORT_SPAN)


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise UsageError(f"{name}={env[name]!r} is not a number") from None


class Rendezvous(Protocol):
    """The launch options SLURM's variables can fill (launching/args.py LaunchOptions has them)."""

    @property
    def nnodes(self) -> str | None: ...
    @property
    def node_rank(self) -> int | None: ...
    @property
    def rdzv_endpoint(self) -> str | None: ...
    @property
    def rdzv_id(self) -> str | None: ...


Options = TypeVar("Options", bound=Rendezvous)


def apply(opts: Options, env: Mapping[str, str]) -> tuple[Options, str | None]:
    """The options with those SLURM's variables decide filled where the command line left them
    unset, and what was taken, in words (None: not a multi-node SLURM job, nothing taken)."""
    if "SLURM_JOB_ID" not in env:
        return opts, None
    nodes_var = "SLURM_JOB_NUM_NODES" if "SLURM_JOB_NUM_NODES" in env else "SLURM_NNODES"
    if nodes_var not in env or "SLURM_NODEID" not in env:
        return opts, None
    nnodes, node = _int(env, nodes_var), _int(env, "SLURM_NODEID")
    if nnodes < 2:
        return opts, None
    if not 0 <= node < nnodes:
        raise UsageError(f"SLURM_NODEID={node} is not below {nodes_var}={nnodes}")
    if env.get("SLURM_LOCALID", "0") != "0" or int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1) > 1:
        raise UsageError("srun starts more than one ddptop on this node: run one per node (srun --ntasks-per-node=1)")
    job = _int(env, "SLURM_JOB_ID")
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        endpoint, source = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", "MASTER_ADDR:MASTER_PORT"
    else:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise UsageError("SLURM_JOB_NODELIST is not set: give --rdzv-endpoint HOST:PORT")
        try:
            first = hostlist.expand_hostlist(nodelist)[0]
        except (hostlist.BadHostlist, IndexError) as exc:
            raise UsageError(f"SLURM_JOB_NODELIST={nodelist!r} is not a hostlist ({exc})") from None
        endpoint, source = f"{first}:{derived_port(job)}", "the first host of SLURM_JOB_NODELIST"
    opts = dataclasses.replace(  # type: ignore[type-var]  # a frozen dataclass, as Rendezvous says of its fields
        opts,
        nnodes=str(nnodes) if opts.nnodes is None else opts.nnodes,
        node_rank=node if opts.node_rank is None else opts.node_rank,
        rdzv_endpoint=endpoint if opts.rdzv_endpoint is None else opts.rdzv_endpoint,
        rdzv_id=str(job) if opts.rdzv_id is None else opts.rdzv_id,
    )
    return opts, f"SLURM job {job}: node {opts.node_rank} of {opts.nnodes}, rendezvous at {opts.rdzv_endpoint} ({source})"
