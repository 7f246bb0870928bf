"""This supervisor's role in the job, as one object: a single node, node 0 of
several (it aggregates and judges), or another node (it forwards and obeys).

The supervisor asks its role, never which role it is: whether it judges,
which node a rank runs on, how to reach another node's supervisor, what
runs in the background, what to close at the end. A single node's answers
are the trivial ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from ddptop.core.wire import records
from ddptop.supervisor.cluster.aggregator import Aggregator
from ddptop.supervisor.cluster.placement import Cluster
from ddptop.supervisor.cluster.uplink import Uplink
from ddptop.supervisor.serving.hub import Hub


class NodeRole(Protocol):
    judges: bool
    """Whether this supervisor's watchdog gives verdicts (node 0's, or a single node's)."""
    commander: str
    """Who a command this supervisor receives comes from, in words."""

    def owner(self, rank: int) -> int | None:
        """The other node a rank runs on; None for this node's own (or unknown) ranks."""
        ...

    def command(self, node: int, frame: records.Command) -> bool:
        """Send a command to another node's supervisor; False if it cannot be reached."""
        ...

    def command_all(self, frame: records.Command) -> None: ...

    async def start(self) -> list[asyncio.Task[None]]:
        """Start what the role runs in the background; its tasks."""
        ...

    def close(self) -> None:
        """The job is over: its nodes leave without alarm."""
        ...


class SingleNode:
    judges = True
    commander = "from a dashboard"

    def owner(self, rank: int) -> int | None:
        return None

    def command(self, node: int, frame: records.Command) -> bool:
        return False

    def command_all(self, frame: records.Command) -> None:
        return None

    async def start(self) -> list[asyncio.Task[None]]:
        return []

    def close(self) -> None:
        return None


class Aggregating(SingleNode):
    """Node 0 of several: the other nodes' supervisors join it and forward their records."""

    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator

    def owner(self, rank: int) -> int | None:
        return self.aggregator.owner(rank)

    def command(self, node: int, frame: records.Command) -> bool:
        return self.aggregator.command(node, frame)

    def command_all(self, frame: records.Command) -> None:
        self.aggregator.command_all(frame)

    def close(self) -> None:
        self.aggregator.closing = True


class Forwarding(SingleNode):
    """Another node: forwards this node's records to node 0 and carries out its commands."""

    judges = False
    commander = "by node 0's supervisor"

    def __init__(self, uplink: Uplink) -> None:
        self.uplink = uplink

    async def start(self) -> list[asyncio.Task[None]]:
        await self.uplink.start()
        return [asyncio.create_task(self.uplink.run())]

    def close(self) -> None:
        self.uplink.close()


def role_of(cluster: Cluster, hub: Hub, on_command: Callable[[records.Command], None], on_lost: Callable[[], None]) -> NodeRole:
    """The role the cluster's placement gives this supervisor, joined to its hub."""
    if cluster.aggregates:
        aggregator = Aggregator(hub.record, cluster.node, cluster.nnodes, hub.run.id)
        hub.collector.node_handler = aggregator.serve
        return Aggregating(aggregator)
    if cluster.uplink is not None:
        uplink = Uplink(cluster.uplink, on_command, on_lost)
        hub.taps.append(uplink.forward)
        return Forwarding(uplink)
    return SingleNode()
