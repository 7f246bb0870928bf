"""The supervisor's socket server: ranks' records in, dashboards served.

Each connection must introduce itself with a hello frame: a rank's
(rank_hello, then batches of records), torchrun's probe's (agent_hello, then
failure and restart records), a dashboard's (viewer_hello, then commands;
see viewers.py) or, on the job's aggregator, another node's supervisor's
(node_hello, then its records; see aggregator.py). Over TCP the first frame
must be the run's token (auth), and only dashboards and nodes may connect:
ranks and torchrun are always local, on the Unix socket. When a rank's connection ends, a `rank_gone` record says
when: the order in which ranks went is how the first failure is told from
the ones it caused. Every frame is size-limited and schema-checked
(wire.validate). A bad frame closes that one connection, is counted and
logged; nothing else is disturbed, and the job itself never depends on a
connection staying up.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import os
import resource
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ddptop.core import wire
from ddptop.core.wire import records, unixpath
from ddptop.core.wire.stream import frames
from ddptop.supervisor.serving.viewers import CommandHandler, Viewers

BACKLOG = 4096
"""Connections the socket queues before accepting: every rank of a large
job connects at once (the default of 100 refuses the rest)."""

Sink = Callable[[wire.Record], None]

RankRecord = (
    records.Step
    | records.Heartbeat
    | records.Uncaught
    | records.Checkpoint
    | records.Resume
    | records.Phase
    | records.RankNote
    | records.Profile
)
"""What a rank's batch carries (schemas.RANK_RECORD_TYPES): every one names its rank."""

PeerHandler = Callable[[records.NodeHello, AsyncIterator[wire.Frame], asyncio.StreamWriter], Awaitable[None]]
"""Serves a connection from its hello on: the hello, the rest of its frames, its writer."""


@dataclass
class _Peer:
    """What a connection has shown of itself, for the error report."""

    address: str
    authenticated: bool
    rank: int | None = None


def _allow_a_connection_per_rank() -> None:
    """Raise the open-file limit to its hard maximum: each rank holds a connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Collector:
    def __init__(self, sink: Sink, viewers: Viewers | None = None, on_command: CommandHandler | None = None) -> None:
        """sink receives every accepted record (already validated)."""
        self._sink = sink
        self._viewers = viewers
        self._on_command = on_command
        self.node_handler: PeerHandler | None = None
        """Set on node 0's supervisor of a multi-node job: the other nodes' supervisors join it."""
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._job_connections: set[asyncio.Task[None]] = set()
        self._rank_connections: dict[int, tuple[int, asyncio.Task[None]]] = {}
        """rank -> (attempt, connection) of the connection that speaks for it."""
        self._rank_writers: dict[int, asyncio.StreamWriter] = {}
        """rank -> the writing end of that connection, for what the supervisor asks of the rank."""
        self.agents: dict[int, asyncio.StreamWriter] = {}
        """node -> the connection of torchrun's probe on it, for restart_go."""
        self.bad_frames = 0
        self._closing = False

    async def start_unix(self, path: Path) -> None:
        _allow_a_connection_per_rank()
        old_umask = os.umask(0o177)
        try:
            with unixpath.usable(str(path)) as short:
                self._servers.append(await asyncio.start_unix_server(self._serve, path=short, backlog=BACKLOG))
        finally:
            os.umask(old_umask)
        path.chmod(0o600)

    async def start_tcp(self, sock: socket.socket, token: str) -> None:
        """Serve dashboards and nodes on an already listening socket; each must give the token first."""
        self._servers.append(await asyncio.start_server(functools.partial(self._serve, token=token), sock=sock))

    async def ranks_done(self, timeout: float = 2.0) -> None:
        """Wait (bounded) for the ranks' and torchrun's connections to deliver their last frames and end."""
        pending = [t for t in self._job_connections if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def close(self, drain_s: float = 2.0) -> None:
        """Stop accepting; give open connections drain_s to deliver their last frames."""
        self._closing = True
        for server in self._servers:
            server.close()
        pending = [t for t in self._connections if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=drain_s)
        for task in self._connections:
            task.cancel()

    def _track_job_connection(self, rank: int | None) -> None:
        """A rank's or torchrun's connection: the job's end waits for it."""
        task = asyncio.current_task()
        assert task is not None
        self._job_connections.add(task)
        task.add_done_callback(self._job_connections.discard)
        if rank is not None:
            task.add_done_callback(lambda _: self._gone(rank))

    def _gone(self, rank: int) -> None:
        if not self._closing:
            self._sink({"type": "rank_gone", "rank": rank, "wall": time.time()})

    def _claim(self, hello: records.RankHello) -> None:
        """One connection per rank and attempt: a second one is a broken or lying peer.

        A restarted rank (the next attempt) takes over from its predecessor,
        whose connection may not have closed yet.
        """
        rank, attempt = hello["rank"], hello["restart"]
        held = self._rank_connections.get(rank)
        if held is not None and held[0] == attempt and not held[1].done():
            raise wire.FrameError(f"rank {rank} (attempt {attempt}) is already connected")
        task = asyncio.current_task()
        assert task is not None
        self._rank_connections[rank] = (attempt, task)

    @staticmethod
    def _hold(writers: dict[int, asyncio.StreamWriter], key: int, writer: asyncio.StreamWriter) -> None:
        """Keep a connection's writer under key while its connection lasts (a newer one's stays)."""
        writers[key] = writer
        task = asyncio.current_task()
        assert task is not None
        task.add_done_callback(lambda _: writers.pop(key, None) if writers.get(key) is writer else None)

    def tell_rank(self, rank: int, frame: records.RankCommand) -> bool:
        """Send a frame to one rank of this node over its own connection (its sender reads it
        between batches); False when the rank is not connected."""
        writer = self._rank_writers.get(rank)
        if writer is None or writer.is_closing():
            return False
        writer.write(wire.encode(frame))
        return True

    def tell_agents(self, frame: records.RestartGo) -> None:
        """Send a frame to torchrun's probe on every node that has one connected."""
        data = wire.encode(frame)
        for writer in self.agents.values():
            if not writer.is_closing():
                writer.write(data)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str | None = None) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = _Peer(_address(writer), authenticated=token is None)
        try:
            await self._read_frames(reader, writer, peer, token)
        except wire.FrameError as exc:
            self.bad_frames += 1
            error = str(exc) if peer.authenticated else f"refused a TCP connection from {peer.address}: {exc}"
            # A rank's broken frames are a data problem of that rank (the job model counts them).
            report: records.WireError = {"type": "wire_error", "wall": time.time(), "error": error}
            if peer.rank is not None:
                report["rank"] = peer.rank
            self._sink(report)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _read_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: _Peer, token: str | None) -> None:
        """peer gets the rank a connection's hello claims, for the error report."""
        stream = frames(reader)
        hello: records.RankHello | records.AgentHello | None = None
        async for frame in stream:
            if not peer.authenticated:
                assert token is not None
                _authenticate(frame, token, writer)
                peer.authenticated = True
                continue
            record = wire.validate(frame)
            if hello is None and record["type"] == "viewer_hello" and self._viewers is not None:
                assert self._on_command is not None
                await self._viewers.serve(record, stream, writer, self._on_command)
                return
            if hello is None and record["type"] == "node_hello" and self.node_handler is not None:
                await self.node_handler(record, stream, writer)
                return
            if hello is None:
                if token is not None:
                    raise wire.FrameError(f"over TCP only dashboards and nodes connect, not {record['type']!r}")
                if record["type"] == "rank_hello":
                    peer.rank = record["rank"]
                    self._claim(record)  # before tracking: a refused twin must not report the rank gone
                    self._hold(self._rank_writers, record["rank"], writer)
                    self._sink(record)
                    self._track_job_connection(record["rank"])
                elif record["type"] == "agent_hello":
                    self._hold(self.agents, record["node"], writer)
                    self._track_job_connection(None)
                else:
                    raise wire.FrameError(f"expected a hello, got {record['type']!r}")
                hello = record
            elif hello["type"] == "agent_hello":
                if record["type"] not in wire.AGENT_RECORD_TYPES:
                    raise wire.FrameError(f"unexpected {record['type']!r} from torchrun's probe")
                self._sink(record)
            elif record["type"] == "batch":
                # validate checked each item: a rank record (schemas.RANK_RECORD_TYPES)
                for item in cast(list[RankRecord], record["items"]):
                    if item["rank"] != hello["rank"]:
                        raise wire.FrameError(f"rank {hello['rank']} sent a record for rank {item['rank']}")
                    self._sink(item)
            else:
                raise wire.FrameError(f"unexpected {record['type']!r} after hello")


def _authenticate(frame: wire.Frame, token: str, writer: asyncio.StreamWriter) -> None:
    """The first frame over TCP must carry the run's token; else refused, said to the peer, raised."""
    given = frame.get("token") if frame.get("type") == "auth" else None
    if isinstance(given, str) and hmac.compare_digest(given.encode(), token.encode()):
        return
    reason = "wrong token" if frame.get("type") == "auth" else f"no token (the first frame was {frame.get('type')!r})"
    writer.write(wire.encode({"type": "refused", "reason": reason}))
    raise wire.FrameError(reason)


def _address(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "the Unix socket"
