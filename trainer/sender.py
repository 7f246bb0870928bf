"""Getting a rank's records to the supervisor without ever blocking a step.

The training thread only appends to a bounded deque (no lock, no syscall);
a daemon thread first has the step records made (collect: the tracker
builds them from the facts the training thread left, steps.py), then
batches what is queued every flush interval (FLUSH_S, longer in large
jobs), adds a heartbeat about once a second, and writes it to the
supervisor's socket. When the supervisor
is slow or gone, records are dropped and counted, never waited for: the
socket has a send timeout, and while there is no connection the thread
empties the queue into the drop count instead of letting it fill. A lost
connection, whether a send fails or the supervisor hangs up, is tried again
RECONNECT_S later, not at the next flush: a supervisor that is gone refuses
or drops the connection again, and the records of that second are counted.
"""

from __future__ import annotations

import collections
import select
import socket
import threading
import time
from collections.abc import Callable

from ddptop.core import wire
from ddptop.core.wire import records, unixpath

FLUSH_S = 0.1
SUPERVISOR_FRAMES_PER_S = 2048
"""Frames a supervisor gets a second from all its ranks together, at most:
a frame costs it a socket read and a wake-up whatever it holds, records
cost it the same batched or not, so past ~200 ranks each rank batches longer."""
HEARTBEAT_S = 1.0
SEND_TIMEOUT_S = 2.0
RECONNECT_S = 1.0
QUEUE_MAX = 8192
RECEIVE_BYTES = 1 << 16


def connect(address: str, timeout: float) -> socket.socket:
    """Open a stream to "unix:PATH" or "tcp:HOST:PORT"."""
    scheme, _, rest = address.partition(":")
    if scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: str | tuple[str, int] = rest
    elif scheme == "tcp":
        host, _, port = rest.rpartition(":")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        target = (host.strip("[]"), int(port))
    else:
        raise ValueError(f"unknown address scheme in {address!r}")
    sock.settimeout(timeout)
    try:
        if isinstance(target, str):
            with unixpath.usable(target) as short:
                sock.connect(short)
        else:
            sock.connect(target)
    except BaseException:
        sock.close()
        raise
    return sock


def flush_interval(world_size: int) -> float:
    """Seconds between a rank's batches: 0.1 up to 204 ranks, 0.5 at 1,024, at most 1."""
    return min(1.0, max(FLUSH_S, world_size / SUPERVISOR_FRAMES_PER_S))


class Sender:
    """Bounded queue plus sender thread plus heartbeat for one rank."""

    def __init__(
        self,
        address: str,
        hello: wire.Frame,
        heartbeat: Callable[[], wire.Frame],
        queue_max: int = QUEUE_MAX,
        collect: Callable[[], None] = lambda: None,
        on_command: Callable[[records.RankCommand], None] = lambda command: None,
    ) -> None:
        self._address = address
        self._hello = hello
        self._heartbeat = heartbeat
        self._collect = collect
        self._on_command = on_command
        self._decoder = wire.FrameDecoder()
        self._queue: collections.deque[wire.Frame] = collections.deque()
        self._queue_max = queue_max
        self._interval = flush_interval(int(hello.get("world_size", 1)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddptop-sender", daemon=True)
        self._sock: socket.socket | None = None
        self._next_connect = 0.0
        self._next_heartbeat = 0.0
        # Two counters, each written by one thread only, so no lock is needed.
        self._dropped_full = 0
        self._dropped_unsent = 0

    @property
    def dropped(self) -> int:
        return self._dropped_full + self._dropped_unsent

    def start(self) -> None:
        self._thread.start()

    def put(self, record: wire.Frame) -> None:
        """Queue a record; called on the training thread, so it never waits."""
        if len(self._queue) >= self._queue_max:
            self._dropped_full += 1
        else:
            self._queue.append(record)

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued, within timeout, then stop the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self._interval)
            self._flush(final=stopping)
            if stopping:
                self._disconnect()
                return

    def _flush(self, final: bool) -> None:
        self._collect()
        now = time.monotonic()
        items: list[wire.Frame] = []
        while self._queue and len(items) < wire.MAX_BATCH - 1:
            items.append(self._queue.popleft())
        if final or now >= self._next_heartbeat:
            items.append(self._heartbeat())
            self._next_heartbeat = now + HEARTBEAT_S
        if self._sock is None and now >= self._next_connect:
            self._connect(now)
        if self._sock is None:
            self._dropped_unsent += len(items)
            return
        try:
            self._sock.sendall(wire.encode({"type": "batch", "items": items}))
        except (OSError, wire.FrameError):
            self._dropped_unsent += len(items)
            self._lost(now)
            return
        self._receive(now)

    def _receive(self, now: float) -> None:
        """What the supervisor sent this rank (rank_command), read without waiting."""
        assert self._sock is not None
        try:
            # A socket with a timeout waits that long in recv whatever its flags: ask first.
            readable, _, _ = select.select([self._sock], [], [], 0)
            if not readable:
                return
            data = self._sock.recv(RECEIVE_BYTES)
        except OSError:
            self._lost(now)
            return
        if not data:  # the supervisor hung up
            self._lost(now)
            return
        try:
            for frame in self._decoder.feed(data):
                if frame.get("type") == "rank_command" and (command := wire.validate(frame))["type"] == "rank_command":
                    self._on_command(command)
        except wire.FrameError:
            self._decoder = wire.FrameDecoder()  # a frame this rank cannot read is dropped, with what followed it

    def _connect(self, now: float) -> None:
        try:
            sock = connect(self._address, SEND_TIMEOUT_S)
            sock.settimeout(SEND_TIMEOUT_S)
            sock.sendall(wire.encode(self._hello))
        except OSError:
            self._lost(now)
            return
        self._sock = sock

    def _lost(self, now: float) -> None:
        """No connection, or none to be had: the next try is RECONNECT_S from now."""
        self._disconnect()
        self._next_connect = now + RECONNECT_S

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._decoder = wire.FrameDecoder()
