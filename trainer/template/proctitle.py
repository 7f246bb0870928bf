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

from ddptop.trainer.procstat import stat_fields

ROOM = 4000
"""Bytes of argv area the template starts with for its children's titles (the kernel reads a page of it)."""


def set_title(argv: Sequence[str]) -> None:
    """Show argv as this process's command line, as far as the argv area holds it."""
    fields = stat_fields(48, 49)  # arg_start, arg_end
    if fields is None:
        return
    start, end = fields
    size = end - start
    if size < 2:
        return
    title = " ".join(argv).encode(errors="replace")[: size - 2]
    ctypes.memmove(start, title + b"\0" + b" " * (size - len(title) - 1), size)
