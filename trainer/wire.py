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
    # A worker process ended with a failure: what only torchrun knows. restart:
    # the job's attempt it ran in (the probe's count, the same on every node).
    "worker_failure": {
        "node": (_INT, True),
        "restart": (_INT, True),
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
    # The supervisor to torchrun's probe: it has judged the failure behind restart
    # number `restart` and not stopped the job, so the restart may go ahead.
    "restart_go": {"restart": (_INT, True)},
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
    # What a dashboard may ask of the supervisor, and the job's aggregator of a
    # node's supervisor (stacks: collect those ranks' Python stacks).
    "command": {"action": (_STR, True), "rank": (_INT, False), "ranks": (_LIST, False)},
    # Over TCP, the first frame of every connection: the run's token.
    "auth": {"token": (_STR, True)},
    # A node's supervisor joins the job's aggregator (node 0's supervisor), which
    # answers node_welcome, or refused and closes; then the node forwards records.
    "node_hello": {"node": (_INT, True), "nnodes": (_INT, True), "host": (_STR, True), "pid": (_INT, True)},
    "node_welcome": {"node": (_INT, True), "run": (_STR, True)},
    "refused": {"reason": (_STR, True)},
    # Records a supervisor makes, which a node forwards to the aggregator.
    "rank_gone": {"rank": (_INT, True), "wall": (_NUM, True)},
    "sample": {"wall": (_NUM, True), "procs": (_LIST, True), "gpus": (_LIST, True), "node": (_INT, False)},
    "stack": {"rank": (_INT, True), "wall": (_NUM, True), "source": (_STR, True), "text": (_STR, True)},
    "action": {"wall": (_NUM, True), "text": (_STR, True), "rank": (_INT, False), "node": (_INT, False)},
    "notice": {"wall": (_NUM, True), "text": (_STR, True), "node": (_INT, False)},
    "wire_error": {"wall": (_NUM, True), "error": (_STR, True), "rank": (_INT, False), "node": (_INT, False)},
}

# The entries of a sample record's lists: one rank process, one GPU.
_SAMPLE_PROC: dict[str, tuple[tuple[type, ...], bool]] = {
    "rank": (_INT, True), "pid": (_INT, True), "cpu": (_NUM, False), "rss": (_INT, False),
    "gpu": (_INT, False), "gpu_mem": (_INT, False),
}
_SAMPLE_GPU: dict[str, tuple[tuple[type, ...], bool]] = {
    "index": (_INT, True), "name": (_STR, False), "util": (_NUM, False), "mem_used": (_INT, False),
    "mem_total": (_INT, False), "temperature": (_NUM, False), "power_w": (_NUM, False),
}

COMMANDS = frozenset({"stop", "restart", "kill_rank", "stacks"})
"""Actions a viewer may request: stop the job, restart the group, kill one rank
(and, from the aggregator to a node, collect stacks)."""

RANK_RECORD_TYPES = frozenset({"step", "heartbeat", "exception", "checkpoint", "resume"})
"""What a batch from a rank may carry."""

AGENT_RECORD_TYPES = frozenset({"worker_failure", "group_restart"})
"""What torchrun's probe may send after its hello."""

FORWARDED_TYPES = RANK_RECORD_TYPES | AGENT_RECORD_TYPES | frozenset(
    {"rank_hello", "rank_gone", "sample", "stack", "action", "notice", "wire_error"})
"""What a node's supervisor forwards to the aggregator: its ranks' and its
torchrun's records, and what it measured and did; not its own summaries."""


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
_PROC_REQUIRED = frozenset({"rank", "pid"})
_GPU_REQUIRED = frozenset({"index"})


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
    _check_fields(kind, schema, frame, _REQUIRED[kind])
    if kind == "command":
        if frame["action"] not in COMMANDS:
            raise FrameError(f"unknown command {frame['action']!r}")
        if any(not isinstance(r, int) or isinstance(r, bool) for r in frame.get("ranks") or []):
            raise FrameError("command: ranks must be integers")
    elif kind == "batch":
        items = frame["items"]
        if len(items) > MAX_BATCH:
            raise FrameError(f"batch of {len(items)} records exceeds {MAX_BATCH}")
        for item in items:
            if not isinstance(item, dict) or item.get("type") not in RANK_RECORD_TYPES:
                raise FrameError("batch item is not a rank record")
            validate(item)
    elif kind == "sample":
        for key, entry_schema, required in (("procs", _SAMPLE_PROC, _PROC_REQUIRED), ("gpus", _SAMPLE_GPU, _GPU_REQUIRED)):
            for entry in frame[key]:
                if not isinstance(entry, dict):
                    raise FrameError(f"sample: an entry of {key} is not a map")
                _check_fields(f"sample {key}", entry_schema, entry, required)
    return frame


def _check_fields(kind: str, schema: dict[str, tuple[tuple[type, ...], bool]], frame: Frame, required: frozenset[str]) -> None:
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
    if not required <= frame.keys():
        missing = sorted(required - frame.keys())
        raise FrameError(f"{kind}: missing field(s) {', '.join(missing)}")


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
