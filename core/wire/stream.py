"""Reading frames from a connection: the one read-and-decode loop.

`frames` turns an asyncio stream into its frames, as they arrive, until the
peer closes; whoever serves a connection iterates it, and may hand the same
iterator on (the collector hands a dashboard's connection to the viewers'
code after its hello), so nothing read is lost between owners. A bad frame
raises FrameError after the good frames before it have been yielded, so a
hello that says who sent the garbage is not lost with it. `socket_frames`
is the same for a blocking socket, with a deadline; `SocketFrames` keeps
what one read brought beyond the frame a caller stopped at for its next
call (several frames often come in one read).

Not imported by the wire package itself: ranks only send, and do not need
asyncio.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator

from ddptop.core.wire.frames import Frame, FrameDecoder

READ_SIZE = 1 << 16


async def frames(reader: asyncio.StreamReader, read_size: int = READ_SIZE) -> AsyncIterator[Frame]:
    """Every frame of the stream, until the peer closes it."""
    decoder = FrameDecoder()
    while data := await reader.read(read_size):
        for frame in decoder.feed(data):
            yield frame
        decoder.raise_deferred()


def socket_frames(sock: socket.socket, deadline: float) -> Iterator[Frame]:
    """Frames from a blocking socket until it closes or time.monotonic() passes deadline."""
    return SocketFrames(sock).until(deadline)


class SocketFrames:
    """A blocking socket's frames, read over several calls, each with its own deadline: the
    frames a read brought that a call did not take are the next call's first."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._decoder = FrameDecoder()
        self._pending: deque[Frame] = deque()

    def until(self, deadline: float) -> Iterator[Frame]:
        """Frames until the socket closes or time.monotonic() passes deadline."""
        while True:
            while self._pending:
                yield self._pending.popleft()
            self._decoder.raise_deferred()  # a bad frame, once the good ones before it are taken
            if (left := deadline - time.monotonic()) <= 0:
                return
            self._sock.settimeout(left)
            try:
                data = self._sock.recv(READ_SIZE)
            except TimeoutError:
                return
            if not data:
                return
            self._pending.extend(self._decoder.feed(data))
