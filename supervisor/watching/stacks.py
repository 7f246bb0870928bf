"""Getting a stuck rank's Python stacks: py-spy when installed, else faulthandler.

The ranks' bootstrap registers faulthandler on STACK_SIGNAL with a file in
the run's stacks/ folder (trainer/runtime.py). Asking for a dump is sending
the signal and reading what the file gained; faulthandler writes from its C
signal handler, so a rank blocked in a collective still answers. py-spy,
when on PATH and allowed to attach, also shows native frames; its dump is
kept next to the others.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from ddptop.trainer.policy import STACK_SIGNAL

DUMP_WAIT_S = 2.0
POLL_S = 0.05
PY_SPY_TIMEOUT_S = 5.0


def stack_file(folder: Path, rank: int, pid: int) -> Path:
    """Where the rank's faulthandler writes (named as runtime.py names it)."""
    return folder / f"rank{rank}.{pid}.txt"


async def dump(folder: Path, rank: int, pid: int) -> tuple[str, str] | None:
    """(source, text) of the rank's stacks now, or None when it cannot say."""
    if shutil.which("py-spy"):
        text = await _py_spy(pid)
        if text:
            (folder / f"rank{rank}.{pid}.py-spy.txt").write_text(text)
            return "py-spy", text
    return await _faulthandler(stack_file(folder, rank, pid), pid)


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
