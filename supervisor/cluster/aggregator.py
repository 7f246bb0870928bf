"""Node 0's side of a multi-node job: the other nodes' supervisors join it.

One supervisor per node watches its own ranks (they connect over its Unix
socket), and node 0's is also the job's aggregator: every other node's
supervisor connects to it over TCP with the token, says node_hello, and then
forwards its records (its ranks', its torchrun's, its samples, its stacks
and actions). So node 0 holds the whole job in one state: its watchdog
compares ranks across nodes, its event log is the job's full story, and one
dashboard attached to it shows every rank. A single judge is why it is an
aggregator and not a peer-to-peer exchange: two watchdogs seeing the same
hang would restart the job twice.

What node 0 decides about another node's ranks (kill a rank, collect
stacks, stop) goes back over the same connection as a command, carried out
by that node's supervisor, which alone may signal its processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ddptop.core import wire
from ddptop.core.wire import records


@dataclass
class _Node:
    host: str
    writer: asyncio.StreamWriter
    ranks: set[int] = field(default_factory=set)


class Aggregator:
    def __init__(self, sink: Callable[[wire.Record], None], node: int, nnodes: int, run_id: str) -> None:
        self._sink = sink
        self.node = node
        self.nnodes = nnodes
        self.run_id = run_id
        self._nodes: dict[int, _Node] = {}
        self._owner: dict[int, int] = {}
        """rank -> the node whose supervisor forwarded its hello."""
        self.closing = False

    def owner(self, rank: int) -> int | None:
        """The remote node a rank runs on; None for this node's own (or unknown) ranks."""
        return self._owner.get(rank)

    def remote_ranks(self, node: int) -> set[int]:
        found = self._nodes.get(node)
        return set() if found is None else set(found.ranks)

    def command(self, node: int, frame: records.Command) -> bool:
        """Send a command to one node's supervisor; False if it is not connected."""
        found = self._nodes.get(node)
        if found is None or found.writer.is_closing():
            return False
        found.writer.write(wire.encode(frame))
        return True

    def command_all(self, frame: records.Command) -> None:
        for node in list(self._nodes):
            self.command(node, frame)

    def _refusal(self, hello: records.NodeHello) -> str | None:
        node = hello["node"]
        if hello["nnodes"] != self.nnodes:
            return f"node {node} says --nnodes {hello['nnodes']}, the job has {self.nnodes}"
        if node == self.node:
            return f"node rank {node} is the aggregator's own"
        if not 0 <= node < self.nnodes:
            return f"node rank {node} is outside --nnodes {self.nnodes}"
        if node in self._nodes:
            return f"node rank {node} is already taken by {self._nodes[node].host}"
        return None

    async def serve(self, hello: records.NodeHello, stream: AsyncIterator[wire.Frame], writer: asyncio.StreamWriter) -> None:
        """One node's supervisor, from its hello until it leaves (the collector's node handler)."""
        node, host = hello["node"], hello["host"]
        reason = self._refusal(hello)
        if reason is not None:
            writer.write(wire.encode({"type": "refused", "reason": reason}))
            await writer.drain()
            self._note(f"refused the supervisor of pid {hello['pid']} on {host}: {reason}")
            return
        self._nodes[node] = entry = _Node(host, writer)
        writer.write(wire.encode({"type": "node_welcome", "node": node, "run": self.run_id}))
        self._note(f"node {node} ({host}, supervisor pid {hello['pid']}) joined the job")
        try:
            async for frame in stream:
                self._forwarded(entry, node, frame)
        finally:
            del self._nodes[node]
            if not self.closing:
                self._note(f"node {node} ({host}) left the job")
                for rank in sorted(entry.ranks):
                    self._sink({"type": "rank_gone", "rank": rank, "wall": time.time()})

    def _forwarded(self, entry: _Node, node: int, frame: wire.Frame) -> None:
        record = wire.validate(frame)
        if record["type"] not in wire.FORWARDED_TYPES:
            raise wire.FrameError(f"node {node} forwarded a {record['type']!r} record")
        if record["type"] == "rank_hello":
            entry.ranks.add(record["rank"])
            self._owner[record["rank"]] = node
        elif record["type"] == "rank_gone":
            entry.ranks.discard(record["rank"])
        elif record["type"] in ("sample", "action", "notice", "wire_error"):
            # said by that node's supervisor, whatever it claims
            record["node"] = node
        self._sink(record)

    def _note(self, text: str) -> None:
        self._sink({"type": "notice", "wall": time.time(), "text": text})
