"""Where a rank's main thread is: the innermost frame of the script's own code, for the WHERE column.

Read on ddptop's sender thread, once a heartbeat, from the main thread's
current frame (sys._current_frames): the training thread does nothing for
it. The walk is bounded, and no failure here may reach the rank.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType

from ddptop.core.places import is_script, place

MAX_DEPTH = 200
"""Frames walked at most: deep recursion costs the sender thread no more than this."""

NATIVE = "in native code"
"""The main thread has no Python frame (inside C code before any Python ran, or gone)."""


def where() -> str:
    """The main thread's innermost frame of the script's own code, else its innermost Python frame."""
    frame: FrameType | None = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return NATIVE
    innermost = frame
    for _ in range(MAX_DEPTH):
        if frame is None:
            break
        if is_script(frame.f_code.co_filename):
            return place(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return place(innermost.f_code.co_filename, innermost.f_lineno, innermost.f_code.co_name)
