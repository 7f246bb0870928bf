"""How a frame is laid out, on a socket and in the event log alike:

    [4-byte big-endian length][msgpack map with a "type" key]

A frame is size-limited before it is decoded, so a peer that sends garbage
is caught at the edge; what a frame of each type may hold is schemas.py's.
Only the standard library and msgpack are imported here: this module is
loaded inside every training rank.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import msgpack

MAX_FRAME = 1 << 20
"""Largest encoded frame body, in bytes; larger ones close the connection."""

MAX_BATCH = 4096
"""Most records one batch frame may carry."""

_HEADER = struct.Struct(">I")

Frame = dict[str, Any]


class FrameError(ValueError):
    """A frame that is oversized, undecodable or does not fit its schema."""


def encode(frame: Mapping[str, Any]) -> bytes:
    """Pack one frame, header included."""
    body: bytes = msgpack.packb(frame, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


def _decode_body(body: bytes) -> Frame:
    try:
        frame = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        raise FrameError(f"undecodable frame: {exc}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise FrameError("frame is not a map with a string 'type'")
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


def last_frame(stream: BinaryIO) -> Frame | None:
    """The last whole frame of a file written with encode(), found by its headers alone:
    a 64 MiB log segment costs a seek per frame, not a decode."""
    last: int | None = None
    end = stream.seek(0, 2)
    offset = 0
    while offset + _HEADER.size <= end:
        stream.seek(offset)
        (size,) = _HEADER.unpack(stream.read(_HEADER.size))
        if offset + _HEADER.size + size > end:
            break
        last, offset = offset, offset + _HEADER.size + size
    if last is None:
        return None
    stream.seek(last)
    (size,) = _HEADER.unpack(stream.read(_HEADER.size))
    return _decode_body(stream.read(size))


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
