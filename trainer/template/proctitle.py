"""The command line `ps`, top and nvitop show for a process forked from the template.

A fork keeps its parent's command line, so every rank would show as the
template. Linux reads /proc/PID/cmdline from the process's own memory (its
argv area, from arg_start to arg_end in /proc/PID/stat), and a process may
write there: a title ending before a last byte that is not NUL is read up
to its NUL (the kernel's setproctitle convention), and psutil splits it at
spaces. So a rank's title is torchrun's command for it, and the template
starts with room for one (ROOM).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

ROOM = 4000
"""Bytes of argv area the template starts with for its children's titles (the kernel reads a page of it)."""


def set_title(argv: Sequence[str]) -> None:
    """Show argv as this process's command line, as far as the argv area holds it."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49
    except (OSError, ValueError, IndexError):
        return
    size = end - start
    if size < 2:
        return
    title = " ".join(argv).encode(errors="replace")[: size - 2]
    ctypes.memmove(start, title + b"\0" + b" " * (size - len(title) - 1), size)
