"""The wire: the one definition of every frame ddptop exchanges.

Ranks, the supervisor, the dashboard and the event log all speak this format,
so this module is the only place that knows how a frame is laid out:

    [4-byte big-endian length][msgpack map with a "type" key]

A frame is size-limited before it is decoded, and checked against its type's
schema after, so a peer that sends garbage is caught at the edge and nothing
malformed reaches the collector. Only the standard library and msgpack are
imported here: this module is loaded inside every training rank.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

import msgpack

MAX_FRAME = 1 << 20
"""Largest encoded frame body, in bytes; larger ones close the connection."""

MAX_BATCH = 4096
"""Most records one batch frame may carry."""

_HEADER = struct.Struct(">I")

Frame = dict[str, Any]

# Field specs: (accepted Python types, required). bool is excluded from the
# numeric types explicitly because msgpack decodes true/false as bool, a
# subclass of int, and a type-confused peer must not pass as a step number.
_INT = (int,)
_NUM = (int, float)
_STR = (str,)
_BOOL = (bool,)
_LIST = (list,)

_RANK_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "rank": (_INT, True),
    "local_rank": (_INT, True),
    "world_size": (_INT, True),
    "node": (_INT, True),
    "host": (_STR, True),
    "pid": (_INT, True),
    "restart": (_INT, True),
}

SCHEMAS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    # A rank introduces itself once per connection.
    "rank_hello": _RANK_FIELDS,
    # Per-step record, built by the trainer's step tracker.
    "step": {
        "rank": (_INT, True),
        "step": (_INT, True),
        "wall": (_NUM, True),
        "step_ms": (_NUM, True),
        "data_ms": (_NUM, False),
        "samples": (_INT, False),
        "tokens": (_INT, False),
        "loss": (_NUM, False),
        "grad_norm": (_NUM, False),
        "comm_ms": (_NUM, False),
        "comm_bytes": (_INT, False),
        "mem_alloc": (_INT, False),
        "mem_reserved": (_INT, False),
        "mem_peak": (_INT, False),
        "total_steps": (_INT, False),
        # The in-rank watchdog (guard.py); clipped is sent whenever --clip-grad is on.
        "nonfinite": (_BOOL, False),
        "local_nonfinite": (_BOOL, False),
        "skipped": (_STR, False),
        "clipped": (_BOOL, False),
        "checksum": (_INT, False),
    },
    # About once a second: liveness and where the rank is.
    "heartbeat": {
        "rank": (_INT, True),
        "wall": (_NUM, True),
        "phase": (_STR, True),
        "step": (_INT, True),
        "dropped": (_INT, True),
    },
    # torchrun's own agent, through ddptop's probe (supervisor/torchrun_probe.py).
    "agent_hello": {"node": (_INT, True)},
    # A worker process ended with a failure: what only torchrun knows.
    "worker_failure": {
        "node": (_INT, True),
        "rank": (_INT, True),
        "local_rank": (_INT, True),
        "pid": (_INT, True),
        "exitcode": (_INT, True),
        "wall": (_NUM, True),
        "message": (_STR, False),
    },
    # torchrun restarts its worker group (restart counts from 1), after backoff_s,
    # because rank failed with exitcode (torchrun's view: the first it saw).
    "group_restart": {
        "node": (_INT, True),
        "restart": (_INT, True),
        "remaining": (_INT, True),
        "wall": (_NUM, True),
        "backoff_s": (_NUM, False),
        "rank": (_INT, False),
        "exitcode": (_INT, False),
    },
    # monitor.checkpoint() wrote a checkpoint (rank 0) / monitor.resume() loaded one.
    "checkpoint": {
        "rank": (_INT, True),
        "wall": (_NUM, True),
        "step": (_INT, True),
        "path": (_STR, True),
        "bytes": (_INT, True),
        "write_ms": (_NUM, True),
    },
    "resume": {"rank": (_INT, True), "wall": (_NUM, True), "step": (_INT, True), "path": (_STR, True), "damaged": (_LIST, True)},
    # The traceback of an exception the script did not catch (its end).
    "exception": {"rank": (_INT, True), "wall": (_NUM, True), "text": (_STR, True)},
    # A rank's records, sent together so the socket sees a few frames a second.
    "batch": {"items": (_LIST, True)},
    # A dashboard introduces itself; with history, it first gets the run so far.
    "viewer_hello": {"history": (_BOOL, False)},
    # What a dashboard may ask of the supervisor.
    "command": {"action": (_STR, True), "rank": (_INT, False)},
}

COMMANDS = frozenset({"stop", "restart", "kill_rank"})
"""Actions a viewer may request: stop the job, restart the group, kill one rank."""

RANK_RECORD_TYPES = frozenset({"step", "heartbeat", "exception", "checkpoint", "resume"})
"""What a batch from a rank may carry."""

AGENT_RECORD_TYPES = frozenset({"worker_failure", "group_restart"})
"""What torchrun's probe may send after its hello."""


class FrameError(ValueError):
    """A frame that is oversized, undecodable or does not fit its schema."""


def encode(frame: Frame) -> bytes:
    """Pack one frame, header included."""
    body = msgpack.packb(frame, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


def _decode_body(body: bytes) -> Frame:
    try:
        frame = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise FrameError(f"undecodable frame: {exc}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise FrameError("frame is not a map with a string 'type'")
    return frame


_REQUIRED = {kind: frozenset(k for k, (_, required) in schema.items() if required) for kind, schema in SCHEMAS.items()}


def validate(frame: Frame) -> Frame:
    """Check a frame from an untrusted peer against its schema; return it.

    Run on every record a supervisor receives (ten thousand a second at
    1,024 ranks), so the common case is one dict lookup and one isinstance
    per field.
    """
    kind = frame.get("type")
    schema = SCHEMAS.get(kind) if isinstance(kind, str) else None
    if schema is None:
        raise FrameError(f"unknown frame type {kind!r}")
    for key, value in frame.items():
        spec = schema.get(key)
        if spec is None:
            if key == "type":
                continue
            raise FrameError(f"{kind}: unknown field {key!r}")
        types = spec[0]
        if not isinstance(value, types) or value.__class__ is bool and bool not in types:
            if value is None and not spec[1]:
                continue
            raise FrameError(f"{kind}: field {key!r} has type {type(value).__name__}")
    if not _REQUIRED[kind] <= frame.keys():
        missing = sorted(_REQUIRED[kind] - frame.keys())
        raise FrameError(f"{kind}: missing field(s) {', '.join(missing)}")
    if kind == "command" and frame["action"] not in COMMANDS:
        raise FrameError(f"unknown command {frame['action']!r}")
    if kind == "batch":
        items = frame["items"]
        if len(items) > MAX_BATCH:
            raise FrameError(f"batch of {len(items)} records exceeds {MAX_BATCH}")
        for item in items:
            if not isinstance(item, dict) or item.get("type") not in RANK_RECORD_TYPES:
                raise FrameError("batch item is not a rank record")
            validate(item)
    return frame


class FrameDecoder:
    """Incremental decoder for a byte stream: feed bytes, get whole frames.

    The length header is checked before the body is buffered, so an
    oversized frame is refused without reading it into memory.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self._error: FrameError | None = None

    def feed(self, data: bytes) -> list[Frame]:
        """The whole frames so far. A bad frame after good ones is raised by
        the next call (or raise_deferred), so the good ones, a hello that
        says who is sending the garbage say, are not lost with it."""
        self.raise_deferred()
        self._buf += data
        frames: list[Frame] = []
        try:
            while len(self._buf) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buf)
                if size > self._max:
                    raise FrameError(f"frame of {size} bytes exceeds the {self._max}-byte limit")
                end = _HEADER.size + size
                if len(self._buf) < end:
                    break
                body = bytes(self._buf[_HEADER.size : end])
                del self._buf[:end]
                frames.append(_decode_body(body))
        except FrameError as exc:
            if not frames:
                raise
            self._error = exc
        return frames

    def raise_deferred(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def read_frames(stream: BinaryIO) -> Iterator[Frame]:
    """Yield the frames of a file written with encode(), e.g. the event log.

    A truncated last frame (the writer died mid-write) ends the iteration
    quietly: everything before it is still good.
    """
    while True:
        header = stream.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        (size,) = _HEADER.unpack(header)
        body = stream.read(size)
        if len(body) < size:
            return
        yield _decode_body(body)
