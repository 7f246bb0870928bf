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

import io
import os
import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import zstandard

from ddptop.core import wire

SEGMENT_BYTES = 64 << 20
ZSTD_LEVEL = 3
"""zstd's default: about 200 MB/s on one core, ample for a log written at a few MB/s."""

_SEGMENT = re.compile(r"^events\.(\d{6,})\.log(\.zst)?$")


class EventLog:
    """Append-only log of wire frames; flushed by the supervisor about once a second."""

    def __init__(self, path: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = path
        self.segment_bytes = segment_bytes
        self.bytes_written = 0
        """Bytes in the current segment (what a reader of events.log finds there)."""
        self.total_bytes = 0
        self._next = max((index for index, _ in _segment_files(path)), default=0) + 1
        # One long-lived thread compresses segments in turn: a thread per
        # segment would leave the allocator an arena per thread, and the
        # supervisor's memory would creep up with every rotation.
        self._compressor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ddptop-log-compress")
        self._compressing: list[Future[None]] = []
        self._file = self._open()

    def _open(self) -> BinaryIO:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "ab", buffering=1 << 16)

    def append(self, record: wire.Frame) -> None:
        self.write(wire.encode(record))

    def write(self, data: bytes) -> None:
        """Append a frame already encoded (the supervisor encodes once for log and viewers)."""
        self._file.write(data)
        self.bytes_written += len(data)
        self.total_bytes += len(data)
        if self.bytes_written >= self.segment_bytes:
            self.rotate()

    def rotate(self) -> None:
        """Close the current segment under its number and start a new one; compress the old in the background."""
        self._file.close()
        closed = self.path.with_name(f"events.{self._next:06d}.log")
        self._next += 1
        os.replace(self.path, closed)
        self._file = self._open()
        self.bytes_written = 0
        self._compressing = [f for f in self._compressing if not f.done()]
        self._compressing.append(self._compressor.submit(compress, closed))

    def open_history(self) -> list[BinaryIO]:
        """Readers of everything logged so far, opened now: later rotations cannot move them."""
        self.flush()
        return [*(open_segment(path) for path in closed_segments(self.path)), self.path.open("rb")]

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        """Close the current segment and wait for the closed ones to be compressed."""
        self._file.close()
        self._compressor.shutdown(wait=True)
        for future in self._compressing:
            future.result()


def compress(path: Path) -> None:
    """path -> path.zst, complete before it has that name; then the plain file goes."""
    target = path.with_name(path.name + ".zst")
    temp = path.with_name(path.name + ".zst.tmp")
    with path.open("rb") as source, open(temp, "wb") as sink:
        zstandard.ZstdCompressor(level=ZSTD_LEVEL).copy_stream(source, sink)
        sink.flush()
        os.fsync(sink.fileno())
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


def read_all(current: Path) -> Iterator[wire.Frame]:
    """Every record of a run's log, rotated segments first."""
    if not current.exists() and not _segment_files(current):
        return
    for path in closed_segments(current):
        with open_segment(path) as stream:
            yield from wire.read_frames(stream)
    if current.exists():
        with current.open("rb") as stream:
            yield from wire.read_frames(stream)
