"""Where the supervisor writes, and what happens when it cannot: every write error handled here.

A supervisor runs for days on servers whose disks fill and whose terminals
go away: its stdout piped to `head`, a `tee` that died, a run directory on
a full filesystem, removed or made read-only. Each place it writes is an
outlet: the event log, meta.json, stack files, stdout, stderr. A write that
fails (OSError: ENOSPC, EPIPE, EIO, EACCES...; ValueError: a closed file)
is dropped and counted, never raised: training must not end, nor go
unwatched, because its watcher cannot write. An outlet's first failure is
said once, and its recovery once with what was dropped meanwhile, as a
notice in the event log (what of it can still be written), to every
dashboard, and on stderr (if that still works).
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

NEVER_BACK = (errno.EPIPE, errno.EBADF)
"""A pipe whose reader is gone, a descriptor closed: this outlet will not come back."""


@dataclass
class Outage:
    since: float
    error: str
    dropped: int = 0
    gone: bool = False
    """It will not come back (a closed pipe): not tried again."""


def describe(exc: BaseException) -> str:
    """ "No space left on device", "Broken pipe": what the user's own tools would say."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class Outlets:
    def __init__(self) -> None:
        self.notify: Callable[[str], None] = self._early
        """Told each outage and recovery, in words: the supervisor records it as a notice. Until
        it takes over, what is told is said on stderr and kept in `early` for its event log."""
        self.early: list[str] = []
        self.down: dict[str, Outage] = {}

    def _early(self, text: str) -> None:
        self.early.append(text)
        self.line(sys.stderr, f"ddptop: {text}")

    def write(self, outlet: str, action: Callable[..., object], *args: object) -> bool:
        """Run one write to outlet, action(*args); False when it failed (dropped, counted, said once)."""
        outage = self.down.get(outlet)
        if outage is not None and outage.gone:
            outage.dropped += 1
            return False
        try:
            action(*args)
        except (OSError, ValueError) as exc:
            self._failed(outlet, exc)
            return False
        outage = self.down.pop(outlet, None)
        if outage is not None:
            self.notify(f"writing {outlet} again, after {time.time() - outage.since:.0f} s of '{outage.error}'")
        return True

    def line(self, stream: TextIO, text: str) -> bool:
        """Print a line for the user on stdout or stderr."""
        name = "stdout" if stream is sys.stdout else "stderr" if stream is sys.stderr else getattr(stream, "name", "output")
        return self.write(name, lambda: print(text, file=stream, flush=True))

    def _failed(self, outlet: str, exc: BaseException) -> None:
        outage = self.down.get(outlet)
        if outage is None:
            # Recorded before it is said: saying it may fail too, and must find it down.
            gone = isinstance(exc, ValueError) or (isinstance(exc, OSError) and exc.errno in NEVER_BACK)
            self.down[outlet] = outage = Outage(time.time(), describe(exc), gone=gone)
            if gone and outlet in ("stdout", "stderr"):
                _to_devnull(sys.stdout if outlet == "stdout" else sys.stderr)
            self.notify(f"cannot write {outlet} ({outage.error}): dropped from now on; the job and its watching go on")
        outage.dropped += 1


def _to_devnull(stream: TextIO) -> None:
    """Point a dead standard stream at /dev/null, so what is still buffered and the
    interpreter's last flush at exit go nowhere instead of failing (a closed pipe
    would make Python print an error at exit and end with status 120)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError):
        return
