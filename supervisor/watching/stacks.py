"""Getting a stuck rank's stacks: py-spy (a dependency), else faulthandler.

py-spy reads the rank's memory from outside, so it needs nothing of the
rank: a rank stopped (SIGSTOP), or stuck in native code with the GIL held,
still shows where it is. `py-spy dump --native` attaches with ptrace and
adds the native frames; a stopped rank cannot be attached to, and gets
`--nonblocking`, its Python frames only. Without py-spy (or where ptrace
is not allowed, some containers) the ranks' bootstrap has registered
faulthandler on STACK_SIGNAL with a file in the run's stacks/raw/ folder
(trainer/runtime.py): asking is sending the signal and reading what the
file gained; it writes from its C signal handler, so a rank blocked in a
collective still answers, but a stopped one cannot. A rank nobody could
read gets a reason (why_none), said once on the alert.

Either dump lists threads in no order a reader needs. What the alert, the
event log, the dashboard and stacks/rank<R>.<pid>.txt get is script_first():
the main thread first (the script's own stack), then the other threads,
then ddptop's own, marked; threads in no Python code are left out.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sysconfig
from pathlib import Path

from ddptop.core.places import is_ddptop, is_template
from ddptop.core.policy import STACK_SIGNAL

DUMP_WAIT_S = 2.0
POLL_S = 0.05
PY_SPY_TIMEOUT_S = 5.0


def stack_file(folder: Path, rank: int, pid: int) -> Path:
    """Where the rank's faulthandler writes (named as runtime.py names it)."""
    return folder / f"rank{rank}.{pid}.txt"


async def dump(raw: Path, rank: int, pid: int) -> tuple[str, str] | None:
    """(source, text) of the rank's stacks now, script first, or None when it cannot say (why_none says why).

    raw is where the rank's faulthandler writes.
    """
    got: tuple[str, str] | None = None
    spy = py_spy()
    if spy is not None:
        for source, flag in (("py-spy --native", "--native"), ("py-spy --nonblocking", "--nonblocking")):
            text = await _py_spy(spy, flag, pid)
            if text:
                got = source, text
                break
    if got is None:
        got = await _faulthandler(stack_file(raw, rank, pid), pid)
    return None if got is None else (got[0], script_first(got[1]))


def py_spy() -> str | None:
    """The py-spy command: on PATH, or beside this Python (a venv that is not activated)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=sysconfig.get_path("scripts"))


def why_none(pid: int) -> str:
    """Why no stack could be read of a live rank, in words for the alert."""
    state = process_state(pid)
    if state is None:
        return "it is gone"
    stopped = " (it is stopped: SIGSTOP, or a debugger holds it)" if state in ("T", "t") else ""
    if py_spy() is None:
        return f"py-spy is not installed and faulthandler got no answer{stopped}"
    return f"py-spy could not read it (ptrace not permitted here?) and faulthandler got no answer{stopped}"


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, T...), None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def keep(folder: Path, rank: int, pid: int, source: str, text: str) -> None:
    """Add a dump to the rank's file in the run's stacks/, as the user reads them."""
    with stack_file(folder, rank, pid).open("a") as stream:
        stream.write(f"--- {source}\n{text}\n")


_THREAD = re.compile(r"^(Current thread|Thread) ")
_PY_SPY_THREAD = re.compile(r"^Thread ", re.MULTILINE)
_PATHS = re.compile(r'File "([^"]+)"|\(([^():]+):\d+\)')
OWN_MARK = "  [ddptop's own thread]"


def script_first(text: str) -> str:
    """A dump's threads reordered: the main thread's first, ddptop's own last and marked.

    Reads faulthandler's dumps ("Thread 0x... (most recent call first):" then
    `File "...", line N in f` lines) and py-spy's ("Thread 123 (idle):
    "MainThread"" then `f (path:N)` lines). The main thread is py-spy's
    MainThread, else the one thread whose outermost frame is not threading's
    _bootstrap. Lines before the first thread (py-spy's process line) stay first.
    """
    lines = text.rstrip("\n").splitlines()
    head: list[str] = []
    blocks: list[list[str]] = []
    for line in lines:
        if _THREAD.match(line):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        else:
            head.append(line)
    main: list[list[str]] = []
    others: list[list[str]] = []
    own: list[list[str]] = []
    native = 0
    for block in map(_without_template, blocks):
        kind = _thread_kind(block)
        if kind == "native":
            native += 1
        elif kind == "own":
            own.append([block[0] + OWN_MARK, *block[1:]])
        else:
            (main if kind == "main" else others).append(block)
    out = head + [line for block in main + others + own for line in _spaced(block)]
    if native:
        out.append(f"({native} thread{'s' if native > 1 else ''} in no Python code left out)")
    return "\n".join(out).rstrip("\n")


_NAME = re.compile(r'^Thread \S+ \([^)]*\): "([^"]*)"')


def _thread_kind(block: list[str]) -> str:
    """main, own (a thread ddptop started), other, or native (no Python frame).

    By what started the thread, not by what it runs now: the training thread
    runs through ddptop's hooks (a backward, an optimizer step) and is still the
    script's. py-spy names threads (MainThread, ddptop-sender); in a
    faulthandler dump the main thread is the one threading's _bootstrap did
    not start, and a thread is ddptop's when the function it was started
    with, its outermost frame outside threading, is ddptop's."""
    frames = [path for line in block[1:] if (path := _frame_path(line))]
    if not frames:
        return "native"
    named = _NAME.match(block[0])
    if named is not None and named[1] == "MainThread":
        return "main"
    started = next((path for path in reversed(frames) if not path.endswith("threading.py")), "")
    if (named is not None and named[1].startswith("ddptop-")) or is_ddptop(started):
        return "own"
    if named is None and not frames[-1].endswith("threading.py"):
        return "main"
    return "other"


def _without_template(block: list[str]) -> list[str]:
    """A thread's block less the frames below the script's in a rank forked from the
    template (its last lines: outermost last), as a rank torchrun started shows none."""
    end, forked = len(block), False
    while end > 1:
        path = _frame_path(block[end - 1])
        if is_template(path):
            forked = True
        elif path and path != "<string>":  # native frames (py-spy --native) lie below the template's too
            break
        end -= 1
    return block[:end] if forked else block


def _frame_path(line: str) -> str:
    match = _PATHS.search(line)
    return (match[1] or match[2]) if match else ""


def _spaced(block: list[str]) -> list[str]:
    """A block ending in one blank line, as both dumps separate threads."""
    while block and not block[-1].strip():
        block = block[:-1]
    return [*block, ""]


async def _py_spy(command: str, flag: str, pid: int) -> str | None:
    try:
        proc = await asyncio.create_subprocess_exec(
            command, "dump", flag, "--pid", str(pid), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), PY_SPY_TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()  # py-spy detaches as it dies: the rank is not left held
        await proc.wait()
        return None
    text = out.decode(errors="replace")
    return text if proc.returncode == 0 and _PY_SPY_THREAD.search(text) else None


async def _faulthandler(path: Path, pid: int) -> tuple[str, str] | None:
    before = path.stat().st_size if path.exists() else 0
    try:
        os.kill(pid, STACK_SIGNAL)
    except ProcessLookupError:
        return None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DUMP_WAIT_S
    last = before
    while loop.time() < deadline:
        await asyncio.sleep(POLL_S)
        size = path.stat().st_size if path.exists() else 0
        if size > before and size == last:
            break  # grown, and done growing
        last = size
    if last <= before:
        return None
    with path.open("rb") as stream:
        stream.seek(before)
        return "faulthandler", stream.read().decode(errors="replace")
