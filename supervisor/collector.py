"""The supervisor's socket server: ranks' records in, dashboards served.

Each connection must introduce itself with a hello frame: a rank's
(rank_hello, then batches of records), torchrun's probe's (agent_hello, then
failure and restart records) or a dashboard's (viewer_hello, then commands;
see viewers.py). When a rank's connection ends, a `rank_gone` record says
when: the order in which ranks went is how the first failure is told from
the ones it caused. Every frame is size-limited and schema-checked
(wire.validate). A bad frame closes that one connection, is counted and
logged; nothing else is disturbed, and the job itself never depends on a
connection staying up.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from ddptop.supervisor.viewers import CommandHandler, Viewers
from ddptop.trainer import unixpath, wire

READ_SIZE = 1 << 16

Sink = Callable[[wire.Frame], None]


class Collector:
    def __init__(self, sink: Sink, viewers: Viewers | None = None, on_command: CommandHandler | None = None) -> None:
        """sink receives every accepted record (already validated)."""
        self._sink = sink
        self._viewers = viewers
        self._on_command = on_command
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()
        self._job_connections: set[asyncio.Task] = set()
        self.bad_frames = 0
        self._closing = False

    async def start_unix(self, path: Path) -> None:
        old_umask = os.umask(0o177)
        try:
            with unixpath.usable(str(path)) as short:
                self._server = await asyncio.start_unix_server(self._serve, path=short)
        finally:
            os.umask(old_umask)
        path.chmod(0o600)

    async def ranks_done(self, timeout: float = 2.0) -> None:
        """Wait (bounded) for the ranks' and torchrun's connections to deliver their last frames and end."""
        pending = [t for t in self._job_connections if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def close(self, drain_s: float = 2.0) -> None:
        """Stop accepting; give open connections drain_s to deliver their last frames."""
        self._closing = True
        if self._server is not None:
            self._server.close()
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._read_frames(reader, writer)
        except wire.FrameError as exc:
            self.bad_frames += 1
            self._sink({"type": "wire_error", "wall": time.time(), "error": str(exc)})
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _read_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = wire.FrameDecoder()
        hello: wire.Frame | None = None
        while data := await reader.read(READ_SIZE):
            frames = decoder.feed(data)
            for index, frame in enumerate(frames):
                wire.validate(frame)
                if hello is None and frame["type"] == "viewer_hello" and self._viewers is not None:
                    assert self._on_command is not None
                    await self._viewers.serve(frame, frames[index + 1 :], reader, writer, decoder, self._on_command)
                    return
                if hello is None:
                    if frame["type"] not in ("rank_hello", "agent_hello"):
                        raise wire.FrameError(f"expected a hello, got {frame['type']!r}")
                    hello = frame
                    self._track_job_connection(frame.get("rank"))
                    if frame["type"] == "rank_hello":
                        self._sink(frame)
                elif hello["type"] == "agent_hello":
                    if frame["type"] not in wire.AGENT_RECORD_TYPES:
                        raise wire.FrameError(f"unexpected {frame['type']!r} from torchrun's probe")
                    self._sink(frame)
                elif frame["type"] == "batch":
                    for item in frame["items"]:
                        if item["rank"] != hello["rank"]:
                            raise wire.FrameError(f"rank {hello['rank']} sent a record for rank {item['rank']}")
                        self._sink(item)
                else:
                    raise wire.FrameError(f"unexpected {frame['type']!r} after hello")
