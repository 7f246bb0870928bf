"""The event log: every record of a run, appended, rotated and compressed as it grows.

    events.log               the segment being written: wire frames, as sent
    events.000001.log.zst    closed segments, zstandard-compressed, oldest first
    events.000001.log        a closed segment whose compression is not done yet

A job of 1,024 ranks writes about 6 GB an hour of step records, so a segment
is closed at SEGMENT_BYTES and compressed by a background thread (the
supervisor's loop only renames a file); the compressed file appears under
its final name only once complete, and the plain one is removed after. A
reader (export, replay, a dashboard's history) reads the closed segments in
order and then the current one, whichever form each is in when it looks.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, cast

import zstandard

from ddptop.core import wire

SEGMENT_BYTES = 64 << 20
ZSTD_LEVEL = 3
"""zstd's default: about 200 MB/s on one core, ample for a log written at a few MB/s."""

_SEGMENT = re.compile(r"^events\.(\d{6,})\.log(\.zst)?$")


Position = tuple[int, int]
"""A point in a run's log: (the number the segment holding it is closed under, bytes into
that segment). The segment being written is closed under the next free number."""

BUFFER_BYTES = 1 << 16
"""Frames are written out when this much is buffered, and at each flush (about once a second)."""


class EventLog:
    """Append-only log of wire frames; flushed by the supervisor about once a second.

    Frames reach the file whole or not at all: a write that fails (a full
    disk) is cut back to the last whole frame and its frames are dropped,
    counted, and raised as the OSError; the supervisor says so (its
    outlets.py) and goes on. The first write that succeeds after a loss puts
    a `notice` of the gap in the log, where the gap is.
    """

    def __init__(self, path: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = path
        self.segment_bytes = segment_bytes
        self.bytes_written = 0
        """Bytes in the current segment (what a reader of events.log finds there)."""
        self.total_bytes = 0
        self._gap: tuple[float, int, OSError] | None = None
        """(since when, frames, the error) of the loss not yet noted in the log."""
        self._next = max((index for index, _ in _segment_files(path)), default=0) + 1
        # One long-lived thread compresses segments in turn: a thread per
        # segment would leave the allocator an arena per thread, and the
        # supervisor's memory would creep up with every rotation.
        self._compressor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ddptop-log-compress")
        self._compressing: list[Future[None]] = []
        self._buffer = bytearray()
        self._buffered_frames = 0
        self._fd: int | None = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, record: wire.Record) -> None:
        self.write(wire.encode(record))

    def write(self, data: bytes) -> None:
        """Append a frame already encoded (the supervisor encodes once for log and viewers).

        Never raises: a write out that fails here is counted, and said by the next flush().
        """
        self._buffer += data
        self._buffered_frames += 1
        if len(self._buffer) >= BUFFER_BYTES or self.bytes_written + len(self._buffer) >= self.segment_bytes:
            with contextlib.suppress(OSError):
                self.flush()

    def flush(self) -> None:
        """Write out the buffered frames, whole frames or none: OSError when none, or when
        frames were lost since the last flush and nothing has been written since."""
        if not self._buffer:
            if self._gap is not None:
                raise OSError(self._gap[2].errno, self._gap[2].strerror)
            return
        if self._gap is not None:
            since, frames, error = self._gap
            text = (
                f"event log gap: {frames} records since {time.strftime('%H:%M:%S', time.localtime(since))} "
                f"were not written ({error.strerror or error})"
            )
            gap = wire.encode({"type": "notice", "wall": time.time(), "text": text})
            self._buffer[:0] = gap
            self._buffered_frames += 1
        try:
            if self._fd is None:
                self._fd = self._open()
            start = os.fstat(self._fd).st_size
            self._write_all(self._fd, start)
        except OSError as exc:
            self._lose(exc)
            raise
        self._gap = None
        self.bytes_written += len(self._buffer)
        self.total_bytes += len(self._buffer)
        self._buffer.clear()
        self._buffered_frames = 0
        if self.bytes_written >= self.segment_bytes:
            self.rotate()

    def _write_all(self, fd: int, start: int) -> None:
        written = 0
        with memoryview(self._buffer) as view:
            try:
                while written < len(view):
                    written += os.write(fd, view[written:])
            except OSError:
                if written:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)  # back to the last whole frame
                raise

    def _lose(self, exc: OSError) -> None:
        frames = self._buffered_frames - (1 if self._gap is not None else 0)
        since, before = self._gap[:2] if self._gap is not None else (time.time(), 0)
        self._gap = (since, before + frames, exc)
        self._buffer.clear()
        self._buffered_frames = 0

    def rotate(self) -> None:
        """Close the current segment under its number and start a new one; compress the old in the background."""
        closed = self.path.with_name(f"events.{self._next:06d}.log")
        os.replace(self.path, closed)  # a read-only or removed folder raises here, and the segment goes on
        self._next += 1
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self.bytes_written = 0
        self._compressing = [f for f in self._compressing if not f.done()]
        self._compressing.append(self._compressor.submit(compress, closed))
        self._fd = self._open()

    def position(self) -> Position:
        """Where the log is now, as a reader finds it after a flush; rotations do not move it."""
        return (self._next, self.bytes_written)

    def open_history(self) -> list[BinaryIO]:
        """Readers of everything logged so far, opened now: later rotations cannot move them.

        What cannot be written or opened now (a full disk, a removed folder) is
        left out: the writer's own flush reports it.
        """
        with contextlib.suppress(OSError):
            self.flush()
        readers: list[BinaryIO] = []
        for path in [*closed_segments(self.path), self.path]:
            with contextlib.suppress(OSError):
                readers.append(open_segment(path) if path != self.path else path.open("rb"))
        return readers

    def close(self) -> None:
        """Write what is buffered, close the current segment and wait for the closed ones to be compressed."""
        try:
            self.flush()
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._compressor.shutdown(wait=True)
            for future in self._compressing:
                future.result()


def compress(path: Path) -> None:
    """path -> path.zst, complete before it has that name; then the plain file goes."""
    target = path.with_name(path.name + ".zst")
    temp = path.with_name(path.name + ".zst.tmp")
    try:
        with path.open("rb") as source, open(temp, "wb") as sink:
            zstandard.ZstdCompressor(level=ZSTD_LEVEL).copy_stream(source, sink)
            sink.flush()
            os.fsync(sink.fileno())
    except OSError:
        temp.unlink(missing_ok=True)  # a full disk: the plain segment stays, and is read as it is
        raise
    os.chmod(temp, 0o600)
    os.replace(temp, target)
    path.unlink()


def _segment_files(current: Path) -> list[tuple[int, Path]]:
    found = []
    for path in current.parent.glob("events.*.log*"):
        match = _SEGMENT.match(path.name)
        if match:
            found.append((int(match[1]), path))
    return found


def closed_segments(current: Path) -> list[Path]:
    """Closed segments oldest first, each in its compressed form once that is complete."""
    by_index: dict[int, Path] = {}
    for index, path in sorted(_segment_files(current)):
        if index not in by_index or path.suffix == ".zst":
            by_index[index] = path
    return [by_index[index] for index in sorted(by_index)]


def open_segment(path: Path) -> BinaryIO:
    try:
        raw = path.open("rb")
    except FileNotFoundError:  # compressed since it was listed
        path = path.with_name(path.name + ".zst")
        raw = path.open("rb")
    if path.suffix != ".zst":
        return raw
    # A decompressing reader may return short reads; the buffer makes reads whole.
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))


def read_all(current: Path) -> Iterator[wire.Record]:
    """Every record of a run's log, rotated segments first."""
    if not current.exists() and not _segment_files(current):
        return
    for path in closed_segments(current):
        with open_segment(path) as stream:
            yield from _records(stream)
    if current.exists():
        with current.open("rb") as stream:
            yield from _records(stream)


def end_position(current: Path) -> Position:
    """The position of the log's end, as its files stand."""
    closed = _segment_files(current)
    size = current.stat().st_size if current.exists() else 0
    return (max((index for index, _ in closed), default=0) + 1, size)


def read_after(current: Path, position: Position) -> Iterator[wire.Record] | None:
    """The records logged after position; None when the log does not reach it (another run's, or cut short)."""
    segment, offset = position
    closed = [(index, path) for path in closed_segments(current) if (index := _index(path)) >= segment]
    if closed and closed[0][0] != segment:
        return None
    if closed:
        parts = [(path, offset if index == segment else 0) for index, path in closed]
        parts.append((current, 0))
    else:
        if (current.stat().st_size if current.exists() else 0) < offset:
            return None
        parts = [(current, offset)]
    return _read_parts(parts)


def _index(path: Path) -> int:
    match = _SEGMENT.match(path.name)
    return int(match[1]) if match else 0


def _read_parts(parts: list[tuple[Path, int]]) -> Iterator[wire.Record]:
    for path, skip in parts:
        if not path.exists() and not path.with_name(path.name + ".zst").exists():
            continue
        with open_segment(path) as stream:
            while skip > 0 and (chunk := stream.read(min(skip, BUFFER_BYTES))):
                skip -= len(chunk)
            yield from _records(stream)


def _records(stream: BinaryIO) -> Iterator[wire.Record]:
    """The log's frames as the records they are: the supervisor wrote only records it had
    checked (schemas.validate) or made itself."""
    return cast(Iterator[wire.Record], wire.read_frames(stream))
