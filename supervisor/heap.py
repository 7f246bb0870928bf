"""Give the supervisor's freed heap back to the system, so its memory stays flat.

At 1,024 ranks the supervisor decodes, logs and forwards 10,000 records a
second and compresses a 64 MiB log segment every 40 s. Its live Python
objects stay flat (sys.getallocatedblocks() does not grow over ten minutes),
yet glibc keeps the pages those records passed through: resident memory
crept from 74 to 90 MiB in ten minutes, and one malloc_trim(0) brought it back
to 76 (bench/scale.py, README "Many ranks on one supervisor"). So the
supervisor trims once a minute. Where the C library has no malloc_trim
(musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

TRIM_S = 60.0


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _load_trim()


def trim() -> bool:
    """Release free heap pages to the system; True when the C library could."""
    return _TRIM is not None and bool(_TRIM(0))
