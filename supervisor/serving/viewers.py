"""Dashboards attached to a supervisor: the run so far first, then the live stream.

A viewer that says hello gets the run so far, then every record as it is
made. A dashboard asks for the job's state as a few snapshot frames
(model/snapshot.py), which cost the same however long the run; a tool that
wants every record (export, a node's catch-up) gets the event log's bytes
(they are wire frames already). Registration and the start's end are taken
in the same step of the event loop, so nothing is missed or sent twice. A viewer too slow to
keep up is disconnected (and may reconnect), never waited for: the
supervisor's loop must not stall on a dashboard.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO

from ddptop.core import wire
from ddptop.core.eventlog import EventLog
from ddptop.core.wire import records

QUEUE_MAX = 20_000
"""Frames a viewer may lag behind before it is dropped."""
HISTORY_CHUNK = 1 << 20

CommandHandler = Callable[[records.Command], None]


class Viewers:
    def __init__(self, log: EventLog, snapshot: Callable[[], list[bytes]], on_drop: Callable[[str], None] = lambda text: None) -> None:
        """snapshot gives the job's state as encoded frames; on_drop is told, in words, of each
        viewer dropped for lagging (the hub logs it)."""
        self._log = log
        self._snapshot = snapshot
        self._on_drop = on_drop
        self._queues: dict[asyncio.Queue[bytes | None], asyncio.StreamWriter] = {}

    @property
    def attached(self) -> int:
        """Dashboards streaming now: one leaves this count once the supervisor has read its last frame."""
        return len(self._queues)

    def broadcast(self, data: bytes) -> None:
        """Queue an encoded frame for every viewer; drop those that lag.

        A viewer QUEUE_MAX frames behind (suspended with Ctrl-Z, or a client
        that never reads) is cut off at once: its queue and its socket's
        buffers are freed, so the supervisor's memory stays bounded however
        long it stalls, and the other viewers and the ranks never wait.
        """
        for queue, writer in list(self._queues.items()):
            try:
                queue.put_nowait(data)
            except asyncio.QueueFull:
                del self._queues[queue]
                writer.transport.abort()
                peer = writer.get_extra_info("peername")
                where = f" at {peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
                self._on_drop(f"dropped a dashboard{where} that fell {QUEUE_MAX} records behind; it may attach again")

    def close_all(self) -> None:
        """The job is over: each viewer gets what is queued, then end of stream."""
        for queue in self._queues:
            while queue.full():
                queue.get_nowait()
            queue.put_nowait(None)
        self._queues.clear()

    async def serve(
        self, hello: records.ViewerHello, stream: AsyncIterator[wire.Frame], writer: asyncio.StreamWriter, on_command: CommandHandler
    ) -> None:
        """Stream to one viewer until the job ends or it leaves.

        stream is the viewer's frames after its hello. A bad frame from the
        viewer raises wire.FrameError, for the collector to count and log.
        """
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_MAX)
        state = self._snapshot() if hello.get("snapshot") else []
        history = self._log.open_history() if hello.get("history", True) and not state else []
        history_end = self._log.bytes_written  # of the current segment, the last of history
        self._queues[queue] = writer
        sender = asyncio.create_task(self._send(writer, queue, state, history, history_end))
        commands = asyncio.create_task(_read_commands(stream, on_command))
        try:
            done, _ = await asyncio.wait({sender, commands}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            self._queues.pop(queue, None)
            sender.cancel()
            commands.cancel()

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        queue: asyncio.Queue[bytes | None],
        state: list[bytes],
        history: list[BinaryIO],
        history_end: int,
    ) -> None:
        """The state's frames or the history (closed segments whole, the current one up to
        history_end), then the live frames."""
        try:
            for frame in state:
                writer.write(frame)
                await writer.drain()
            for index, segment in enumerate(history):
                limit = history_end if index == len(history) - 1 else None
                offset = 0
                while limit is None or offset < limit:
                    chunk = segment.read(HISTORY_CHUNK if limit is None else min(HISTORY_CHUNK, limit - offset))
                    if not chunk:
                        break
                    offset += len(chunk)
                    writer.write(chunk)
                    await writer.drain()
        finally:
            for segment in history:
                segment.close()
        while (data := await queue.get()) is not None:
            # Everything queued goes in one write: at 1,024 ranks that is
            # thousands of frames a second, and an await per frame costs more
            # than the frames.
            frames = [data]
            while not queue.empty() and (data := queue.get_nowait()) is not None:
                frames.append(data)
            writer.write(b"".join(frames))
            await writer.drain()
            if data is None:
                return


async def _read_commands(stream: AsyncIterator[wire.Frame], on_command: CommandHandler) -> None:
    """Commands from a dashboard, until it disconnects."""
    async for frame in stream:
        record = wire.validate(frame)
        if record["type"] != "command":
            raise wire.FrameError(f"a viewer may send commands only, not {record['type']!r}")
        on_command(record)
