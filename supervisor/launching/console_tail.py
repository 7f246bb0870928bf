"""The ranks' output on the console, with a progress bar redrawn in place as plain torchrun shows it.

ddptop runs torchrun with `--tee` so that it keeps each rank's output in the
run's logs and also writes it to the console, each line after its rank's
prefix. torchrun's tee (tail_log.tail_logfile) reads each log in universal-newline
mode: every redraw of a progress bar (tqdm writes "\\r" and the whole bar at each
update, and the Hugging Face Trainer and Lightning use it) comes out as a line of
its own, hundreds where plain torchrun, which leaves the ranks on the console,
shows one bar. The tee is replaced in torchrun's process (torchrun_probe) by
`tail_logfile` here, which ends a line at "\\n" or "\\r" and keeps that ending: a
redraw goes out with its prefix and its "\\r", and a terminal draws the next one
over it. A bar's "\\r" comes before its text, so each redraw is written when the
next one begins (a tenth of a second later for tqdm); text that ends no line
within HELD_S is written as it is, and the rest of its line after it, with no
second prefix inside the line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from threading import Event
from typing import TextIO

HELD_S = 1.0
"""How long text that ends no line (a prompt, a redraw that is the last for now) waits for its end."""


def tail_logfile(
    header: str,
    file: str,
    dst: TextIO,
    finished: Event,
    interval_sec: float,
    log_line_filter: Callable[[str], bool] | None = None,
) -> None:
    """torchrun's tail_logfile, with a line ending at "\\r" kept (its signature: an older torch,
    2.3's, passes no log_line_filter, and then every line is written)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    held, since, cut = "", 0.0, False
    with open(file, errors="replace", newline="") as fp:  # reads end at "\r" too, and keep it
        while True:
            text = fp.readline()
            if text:
                held, since = held + text, since or time.monotonic()
                if not held.endswith(("\n", "\r")):
                    continue
            elif not held or (not finished.is_set() and time.monotonic() - since < HELD_S):
                if finished.is_set():
                    return
                time.sleep(interval_sec)
                continue
            line, held, since = held, "", 0.0
            rest, cut = cut, not line.endswith(("\n", "\r"))  # also for a line the filter leaves out
            if log_line_filter is not None and not log_line_filter(line):
                continue
            if rest:  # the rest of a line written before its end came: no prefix inside it
                dst.write(line)
            elif line != "\r":  # a bare "\r" begins the next redraw
                dst.write(f"{header}{line}")
