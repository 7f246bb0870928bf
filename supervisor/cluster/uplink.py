"""A node's side of a multi-node job: join node 0's supervisor, forward, obey.

`join` runs before the job starts (before `launch` forks): it connects to
the aggregator, retrying while node 0 starts up, gives the token and says
node_hello, and waits for the answer. A refusal (a node rank another node
already has) or no answer in time is bad input, said in one line, with
nothing started. Then `Uplink` forwards this node's records as the hub makes
them and carries the aggregator's commands to the supervisor. Forwarding
never waits: a connection that cannot keep up drops records and counts
them, and a lost aggregator leaves this node's job running on its own.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

from ddptop.core import wire
from ddptop.core.usage import UsageError
from ddptop.core.wire import records
from ddptop.core.wire.stream import frames, socket_frames
from ddptop.supervisor.cluster import endpoints

RETRY_S = 0.25
WRITE_BUFFER_MAX = 16 << 20
"""Bytes queued for the aggregator before records are dropped, not queued."""


def join(host: str, port: int, token: str, hello: records.NodeHello, timeout: float) -> socket.socket:
    """The welcomed connection to the aggregator, or UsageError saying why not."""
    where = endpoints.text(host, port)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            break
        except socket.gaierror as exc:
            raise UsageError(f"cannot resolve {host!r}: {exc.strerror}") from None
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise UsageError(
                    f"no ddptop supervisor of node 0 answered at {where} within {timeout:.0f} s "
                    f"({exc.strerror or exc}); check the rendezvous endpoint and that node 0 runs"
                ) from None
            time.sleep(RETRY_S)
    try:
        sock.sendall(wire.encode({"type": "auth", "token": token}) + wire.encode(hello))
        answer = next(socket_frames(sock, max(deadline, time.monotonic() + 1.0)), None)
    except (OSError, wire.FrameError) as exc:
        sock.close()
        raise UsageError(f"node 0's supervisor at {where} did not answer ({exc})") from None
    if answer is not None and answer.get("type") == "node_welcome":
        sock.settimeout(None)
        return sock
    sock.close()
    if answer is None:
        raise UsageError(f"node 0's supervisor at {where} did not answer within {timeout:.0f} s")
    reason = answer.get("reason") if answer.get("type") == "refused" else f"it answered {answer.get('type')!r}"
    raise UsageError(f"node 0's supervisor at {where} refused node {hello['node']}: {reason}")


class Uplink:
    def __init__(self, sock: socket.socket, on_command: Callable[[records.Command], None], on_lost: Callable[[], None]) -> None:
        self._sock = sock
        self._on_command = on_command
        self._on_lost = on_lost
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.dropped = 0

    def forward(self, frame: wire.Record, data: bytes) -> None:
        """A record the hub made (data: its encoding); this node's own summaries stay here."""
        writer = self._writer
        if writer is None or writer.is_closing() or frame["type"] not in wire.FORWARDED_TYPES:
            return
        if writer.transport.get_write_buffer_size() > WRITE_BUFFER_MAX:
            self.dropped += 1
            return
        writer.write(data)

    async def start(self) -> None:
        """Take the joined socket onto the event loop: forwarding starts here."""
        self._reader, self._writer = await asyncio.open_connection(sock=self._sock)

    async def run(self) -> None:
        """Carry the aggregator's commands until it goes away."""
        assert self._reader is not None and self._writer is not None
        try:
            async for frame in frames(self._reader):
                record = wire.validate(frame)
                if record["type"] == "command":
                    self._on_command(record)
        except (wire.FrameError, ConnectionError):
            pass
        finally:
            self._writer.close()
        self._on_lost()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
