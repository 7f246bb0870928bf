"""Shared helpers: real processes, real sockets, waits on conditions with deadlines."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddptop.core import rundir, wire

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # the synthetic-rank load generator
DDPTOP = str(Path(sys.executable).parent / "ddptop")
EXAMPLE = REPO / "examples" / "train.py"
SCRIPTS = REPO / "tests" / "scripts"


class Deadline:
    """The one way a test waits: on a condition, failing with what it waited for at a deadline."""

    def __init__(self, timeout: float, what: str) -> None:
        self.at = time.monotonic() + timeout
        self.timeout, self.what = timeout, what

    def check(self) -> None:
        if time.monotonic() > self.at:
            pytest.fail(f"timed out after {self.timeout}s waiting for {self.what}")


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> object:
    """Poll predicate until it returns something truthy (blocking code: processes, sockets)."""
    deadline = Deadline(timeout, what)
    while not (value := predicate()):
        deadline.check()
        time.sleep(interval)
    return value


async def until(predicate: Callable[[], object], what: str, timeout: float = 10.0, interval: float = 0.02) -> object:
    """The same on the event loop, for asyncio code and a Textual app under Pilot (they run on it)."""
    deadline = Deadline(timeout, what)
    while not (value := predicate()):
        deadline.check()
        await asyncio.sleep(interval)
    return value


def recorded(run: rundir.RunDir) -> list[wire.Frame]:
    """Every record of a run's event log, each checked against its type's schema (the supervisor's own too)."""
    records = list(rundir.read_events(run))
    for record in records:
        wire.validate(record)
    return records


@pytest.fixture
def ddptop_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ddptop state root, so tests never see the developer's runs."""
    home = tmp_path / "home"
    monkeypatch.setenv("DDPTOP_HOME", str(home))
    return home


def run_ddptop(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the installed `ddptop` command as a user would."""
    return subprocess.run([DDPTOP, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
