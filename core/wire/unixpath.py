"""Unix socket paths longer than AF_UNIX allows (about 107 bytes).

A run directory under a deep home or a test's temporary folder can exceed
it. On Linux a directory opened as a file descriptor is reachable as
/proc/self/fd/N, so a long path is bound or connected through that short
alias while the descriptor is open; the socket file itself lives at the
real path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

LIMIT = 100


@contextmanager
def usable(path: str) -> Iterator[str]:
    """A path to bind or connect to that stands for `path`, valid inside the block."""
    if len(path) <= LIMIT:
        yield path
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)
