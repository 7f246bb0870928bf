"""Reading a failed rank's stderr: what of it a crash verdict shows, and the line that says how it died."""

from __future__ import annotations

import re
import signal
from typing import NamedTuple

from ddptop.core.places import is_script, place


class LogTail(NamedTuple):
    """The end of a failed rank's stderr, and when the rank last wrote to it."""

    lines: list[str]
    written: float | None = None
    """Unix seconds (the file's mtime); None where unknown (another node's rank)."""


OLD_OUTPUT_S = 10.0
"""A failed rank's last output this long before it died is said to be old: a warning at start-up
is not why a rank killed at step 900 died."""


def last_words(tail: LogTail, died: float) -> str:
    """How a crash verdict introduces the rank's last output: its age, where that is telling."""
    if tail.written is not None and died - tail.written >= OLD_OUTPUT_S:
        return f"its last output, {died - tail.written:.0f} s before it died"
    return "its log ends"


def crash_excerpt(log: list[str], lines: int) -> list[str]:
    """What of a failed rank's stderr tail a crash verdict carries.

    A faulthandler report (a fatal signal) is kept from its first line on,
    less the threads that were in no Python code (gloo's and other native
    threads, which ddptop gives a Python thread state), so that the error
    and the Python stacks fit; any other log gives its last lines.
    """
    start = next((i for i, line in enumerate(log) if line.startswith("Fatal Python error")), None)
    if start is None:
        return log[-lines:]
    kept: list[str] = []
    report = log[start:]
    index = 0
    while index < len(report):
        if report[index].startswith("Thread 0x") and index + 1 < len(report) and "<no Python frame>" in report[index + 1]:
            index += 3 if index + 2 < len(report) and not report[index + 2].strip() else 2
            continue
        kept.append(report[index])
        index += 1
    return kept[: 3 * lines]


_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
"""The first line Python prints of a warning ("train.py:80: FutureWarning: ..."); its source line follows, indented."""


def last_error_line(log: list[str]) -> str | None:
    """The line of a rank's stderr that best says how it died.

    faulthandler's report of a fatal signal ends with a list of extension
    modules; the telling part is the error and the innermost Python frame of
    the thread that took the signal (listed after the other threads). A
    traceback's telling line is its exception's (exception_line); any other
    log's, its last.
    """
    for index, line in enumerate(log):
        if line.startswith("Fatal Python error"):
            report = log[index:]
            current = next((i for i, f in enumerate(report) if f.startswith("Current thread")), 0)
            frame = next((f.strip() for f in report[current:] if f.strip().startswith("File ")), None)
            return line.strip() + (f" in {frame}" if frame else "")
    said = [line for line in log if line.strip()]
    if len(said) >= 2 and said[-1][0].isspace() and _WARNING.match(said[-2]):  # a warning, then its source line
        return exception_line(log) or said[-2].strip()
    return exception_line(log) or next((line.strip() for line in reversed(log) if line.strip()), None)


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')

_RANK_PREFIX = re.compile(r"^\[[^\]]*\]: ?")
"""What torchrun writes before each line of a rank's output ("[rank0]: ")."""


def exception_line(lines: list[str]) -> str | None:
    """The line that names a traceback's last exception: its type and its message's first line.

    Python prints the exception below the traceback's frames, and a message of several
    lines goes on below that: torch's errors add hints (DDP's unused parameters, the
    environment variable that would say more), so the text's last line is the end of a
    hint, not what went wrong. It is the first line after the last frame that is not
    indented (the frames' source lines and carets are). None where no frame is found
    (a traceback cut short, or none at all).
    """
    bare = [_RANK_PREFIX.sub("", line, count=1) for line in lines]
    last = max((i for i, line in enumerate(bare) if _FRAME.match(line)), default=None)
    if last is None:
        return None
    return next((line.strip() for line in bare[last + 1 :] if line.strip() and not line[0].isspace()), None)


def script_frame(traceback_text: str) -> str | None:
    """The innermost frame of the script's own code in a traceback, as "train.py:89 in <module>".

    The frames of torch, the standard library or ddptop say where an error
    surfaced; the user needs the line of their own code that led there.
    """
    found = None
    for line in traceback_text.splitlines():
        match = _FRAME.match(line)
        if match and is_script(match["path"]):
            found = place(match["path"], match["line"], match["function"])
    return found


_PORT_IN_USE = re.compile(r"port:? (\d+)\b[^\n]*EADDRINUSE|EADDRINUSE[^\n]*port:? (\d+)\b")


def port_in_use(text: str) -> int | None:
    """The port a rendezvous could not listen on, from torch's error (`port: 12355, ..., name: EADDRINUSE`)."""
    found = _PORT_IN_USE.search(text)
    return None if found is None else int(found.group(1) or found.group(2))


_SPAWNED = re.compile(r"\b[Pp]rocess (\d+) terminated with (?:signal (SIG\w+)|exit code (-?\d+))?")


def spawned_failure(text: str) -> tuple[int, int | None] | None:
    """The child torch.multiprocessing.spawn says failed first, as torchrun's report names a
    worker: (its index among the spawned, its exit code, negative for a signal, or None where
    it raised: "-- Process 1 terminated with the following error:")."""
    match = _SPAWNED.search(text)
    if match is None:
        return None
    index, name, code = int(match[1]), match[2], match[3]
    if name is not None:
        try:
            return index, -signal.Signals[name].value
        except KeyError:
            return index, None
    return index, None if code is None else int(code)
