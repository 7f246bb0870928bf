"""Where the dashboard's records come from: a live supervisor or a run's log.

The dashboard talks to a supervisor only through this module, over the wire:
`LiveSource` says viewer_hello on the supervisor's socket and receives the
run so far then the live stream (the same code for `launch` and `attach`);
`ReplaySource` reads a finished run's saved state and the log after it.
Both yield the same records, which the app folds into the shared JobState.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import cast

from ddptop.core import wire
from ddptop.core.eventlog import end_position
from ddptop.core.model import snapshot
from ddptop.core.model.job import Ingested, JobState
from ddptop.core.rundir import RunDir
from ddptop.core.wire import records, unixpath
from ddptop.core.wire.stream import frames

CLOSE_WAIT_S = 2.0
"""How long leaving waits for the supervisor to have read the last commands."""


class LiveSource:
    """A supervisor's stream: on its Unix socket (socket_path), or over TCP
    (tcp: (host, port)) with the run's token as the first frame."""

    live = True

    def __init__(self, socket_path: Path | None = None, tcp: tuple[str, int] | None = None, token: str | None = None) -> None:
        self.socket_path = socket_path
        self.tcp = tcp
        self.token = token
        self._writer: asyncio.StreamWriter | None = None
        self._ended = asyncio.Event()

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.tcp is not None:
            reader, writer = await asyncio.open_connection(*self.tcp, limit=1 << 20)
            writer.write(wire.encode({"type": "auth", "token": self.token or ""}))
            return reader, writer
        assert self.socket_path is not None
        with unixpath.usable(str(self.socket_path)) as short:
            return await asyncio.open_unix_connection(short, limit=1 << 20)

    async def records(self) -> AsyncIterator[Ingested]:
        reader, self._writer = await self._open()
        self._writer.write(wire.encode({"type": "viewer_hello", "snapshot": True}))
        await self._writer.drain()
        try:
            async for frame in frames(reader):
                yield cast(Ingested, frame)  # the supervisor's records and its state's frames, as it made them
        finally:
            self._ended.set()

    async def command(self, action: str, rank: int | None = None) -> bool:
        """Ask the supervisor to act (stop, restart, kill_rank); whether it could be asked.
        A supervisor that is gone (its job ended while a question was open) cannot: that
        is an answer, not an error."""
        if self._writer is None or self._writer.is_closing():
            return False
        frame: records.Command = {"type": "command", "action": cast(records.CommandAction, action)}
        if rank is not None:
            frame["rank"] = rank
        try:
            self._writer.write(wire.encode(frame))
            await self._writer.drain()
        except OSError:  # ConnectionResetError and BrokenPipeError among them
            return False
        return True

    async def close(self) -> None:
        """Leave, after the supervisor has read what was sent: half-close, and wait (briefly)
        for its end of stream. Closing at once loses a command sent just before (quit and
        stop): the supervisor's next write to a closed socket fails, and asyncio then drops
        what it had received and not yet read."""
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._ended.wait(), CLOSE_WAIT_S)
        writer.close()

    def finished(self, state: JobState) -> None:
        """The supervisor keeps the state: nothing to do."""


class ReplaySource:
    """The run's saved state (model/snapshot.py) and the records logged after it; a run with
    none, or one that does not fit its log, is read whole once and its state kept for next time."""

    live = False

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.read_whole = False

    def _start(self) -> Iterator[Ingested]:
        records, self.read_whole = snapshot.replayed(self.run.snapshot_path, self.run.events_path)
        return records

    async def records(self) -> AsyncIterator[Ingested]:
        for record in self._start():
            yield record  # the app gives keys their turn as it folds (app.YIELD_EVERY), live or replayed

    def finished(self, state: JobState) -> None:
        """Keep the state a whole read built, so the next replay starts from it; a run
        directory that cannot be written (another user's) is replayed whole each time."""
        if self.read_whole:
            with contextlib.suppress(OSError):
                snapshot.save(self.run.snapshot_path, state, end_position(self.run.events_path))

    async def command(self, action: str, rank: int | None = None) -> bool:
        """A finished run takes no commands."""
        return False

    async def close(self) -> None:
        return None


Source = LiveSource | ReplaySource
