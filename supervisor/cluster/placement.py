"""This supervisor's place in the job: which node, and its TCP wire.

A job of one node needs no TCP unless --listen asks for it (remote attach).
In a job of several nodes, node 0's supervisor is the aggregator
(aggregator.py): it listens where the other nodes can reach it, by default
on the rendezvous host at the rendezvous port + 1, since the rendezvous
endpoint is the address every node already knows for node 0. Every other
node's supervisor joins it (uplink.py) before its torchrun starts. All of it
is decided here, before anything runs, so a mistake is one line and exit 2.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ddptop.core import launch_env
from ddptop.core.usage import UsageError
from ddptop.core.wire import records
from ddptop.supervisor.cluster import endpoints, uplink
from ddptop.supervisor.cluster.slurm import Rendezvous

RDZV_DEFAULT_PORT = 29400
"""torchrun's port when --rdzv-endpoint names a host only."""


@dataclass
class Cluster:
    node: int = 0
    nnodes: int = 1
    token: str = ""
    listener: socket.socket | None = None
    """The TCP wire: dashboards (and on node 0 of several, the other nodes) connect here."""
    uplink: socket.socket | None = None
    """On nodes other than 0: the joined connection to the aggregator."""
    aggregator_address: str | None = None

    def close(self) -> None:
        for sock in (self.listener, self.uplink):
            if sock is not None:
                sock.close()

    @property
    def aggregates(self) -> bool:
        return self.nnodes > 1 and self.node == 0

    @property
    def listen_address(self) -> str | None:
        if self.listener is None:
            return None
        host, port = self.listener.getsockname()[:2]
        return endpoints.text(host, port)


def node_count(spec: str | None) -> int:
    """--nnodes N or MIN:MAX (torchrun's elastic range: the most nodes the job may have)."""
    if spec is None:
        return 1
    try:
        counts = [int(part) for part in spec.split(":")]
    except ValueError:
        counts = []
    if len(counts) not in (1, 2) or min(counts) < 1:
        raise UsageError(f"--nnodes {spec!r} is not N or MIN:MAX")
    return counts[-1]


def rendezvous(spec: str) -> tuple[str, int]:
    if ":" not in spec.strip("[]") or spec.endswith("]"):
        return spec.strip("[]"), RDZV_DEFAULT_PORT
    return endpoints.parse(spec, what="--rdzv-endpoint")


class ClusterOptions(Rendezvous, Protocol):
    """The launch options that place this node in the job (launching/args.py LaunchOptions has them)."""

    @property
    def aggregator(self) -> str | None: ...
    @property
    def listen(self) -> str | None: ...
    @property
    def token_file(self) -> Path | None: ...
    @property
    def join_timeout(self) -> float: ...


def plan(opts: ClusterOptions) -> Cluster:
    """Bind the listener and, on nodes other than 0, join node 0's supervisor."""
    nnodes = node_count(opts.nnodes)
    token = endpoints.given_token(opts.token_file)
    cluster = Cluster(node=opts.node_rank or 0, nnodes=nnodes)
    if opts.rdzv_endpoint is not None:
        endpoints.resolve(rendezvous(opts.rdzv_endpoint)[0], "--rdzv-endpoint")
    if nnodes > 1:
        if opts.node_rank is None:
            raise UsageError(f"--nnodes {opts.nnodes} needs --node-rank (0 on the node of the rendezvous endpoint)")
        if opts.rdzv_endpoint is None:
            raise UsageError(f"--nnodes {opts.nnodes} needs --rdzv-endpoint HOST:PORT")
        if cluster.node >= nnodes:
            raise UsageError(f"--node-rank {cluster.node} is outside --nnodes {opts.nnodes}")
        rdzv_host, rdzv_port = rendezvous(opts.rdzv_endpoint)
        host, port = endpoints.parse(opts.aggregator, what="--aggregator") if opts.aggregator else (rdzv_host, rdzv_port + 1)
        cluster.aggregator_address = endpoints.text(host, port)
        if cluster.node == 0:
            bind = endpoints.parse(opts.listen, default_host=host, what="--listen") if opts.listen else (host, port)
            cluster.listener = endpoints.listen(*bind, "the job's other nodes")
        else:
            if token is None:
                raise UsageError(
                    f"node {cluster.node} needs the job's token to join node 0's supervisor: "
                    f"set {launch_env.TOKEN} (the same on every node) or give --token-file"
                )
            hello: records.NodeHello = {
                "type": "node_hello",
                "node": cluster.node,
                "nnodes": nnodes,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
            cluster.uplink = uplink.join(host, port, token, hello, opts.join_timeout)
    if cluster.listener is None and opts.listen:
        cluster.listener = endpoints.listen(*endpoints.parse(opts.listen, what="--listen"), "the wire (--listen)")
    cluster.token = token or endpoints.new_token()
    return cluster
