"""Getting a stuck rank's Python stacks: py-spy when installed, else faulthandler.

The ranks' bootstrap registers faulthandler on STACK_SIGNAL with a file in
the run's stacks/raw/ folder (trainer/runtime.py). Asking for a dump is
sending the signal and reading what the file gained; faulthandler writes
from its C signal handler, so a rank blocked in a collective still answers.
py-spy, when on PATH and allowed to attach, also shows native frames.

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
from pathlib import Path

from ddptop.core.places import is_ddptop, is_template
from ddptop.trainer.policy import STACK_SIGNAL

DUMP_WAIT_S = 2.0
POLL_S = 0.05
PY_SPY_TIMEOUT_S = 5.0


def stack_file(folder: Path, rank: int, pid: int) -> Path:
    """Where the rank's faulthandler writes (named as runtime.py names it)."""
    return folder / f"rank{rank}.{pid}.txt"


async def dump(raw: Path, rank: int, pid: int) -> tuple[str, str] | None:
    """(source, text) of the rank's stacks now, script first, or None when it cannot say.

    raw is where the rank's faulthandler writes.
    """
    got: tuple[str, str] | None = None
    if shutil.which("py-spy"):
        text = await _py_spy(pid)
        if text:
            got = "py-spy", text
    if got is None:
        got = await _faulthandler(stack_file(raw, rank, pid), pid)
    return None if got is None else (got[0], script_first(got[1]))


def keep(folder: Path, rank: int, pid: int, source: str, text: str) -> None:
    """Add a dump to the rank's file in the run's stacks/, as the user reads them."""
    with stack_file(folder, rank, pid).open("a") as stream:
        stream.write(f"--- {source}\n{text}\n")


_THREAD = re.compile(r"^(Current thread|Thread) ")
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
        frames = [line for line in block[1:] if line.strip()]
        if not frames or all("<no Python frame>" in line for line in frames):
            native += 1
        elif '"ddptop-' in block[0] or any(is_ddptop(_frame_path(line)) for line in frames):
            own.append([block[0] + OWN_MARK, *block[1:]])
        elif '"MainThread"' in block[0] or "_bootstrap" not in frames[-1]:
            main.append(block)
        else:
            others.append(block)
    out = head + [line for block in main + others + own for line in _spaced(block)]
    if native:
        out.append(f"({native} thread{'s' if native > 1 else ''} in no Python code left out)")
    return "\n".join(out).rstrip("\n")


def _without_template(block: list[str]) -> list[str]:
    """A thread's block less the frames below the script's in a rank forked from the
    template (its last lines: outermost last), as a rank torchrun started shows none."""
    end, forked = len(block), False
    while end > 1:
        path = _frame_path(block[end - 1])
        if is_template(path):
            forked = True
        elif block[end - 1].strip() and path != "<string>":
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


async def _py_spy(pid: int) -> str | None:
    try:
        proc = await asyncio.create_subprocess_exec(
            "py-spy",
            "dump",
            "--pid",
            str(pid),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), PY_SPY_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError):
        return None
    return out.decode(errors="replace") if proc.returncode == 0 else None


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
