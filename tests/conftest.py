"""Shared helpers: real processes, real sockets, waits on conditions with deadlines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # the synthetic-rank load generator
DDPTOP = str(Path(sys.executable).parent / "ddptop")
EXAMPLE = REPO / "examples" / "train.py"
SCRIPTS = REPO / "tests" / "scripts"


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> object:
    """Poll predicate until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def ddptop_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ddptop state root, so tests never see the developer's runs."""
    home = tmp_path / "home"
    monkeypatch.setenv("DDPTOP_HOME", str(home))
    return home


def run_ddptop(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the installed `ddptop` command as a user would."""
    return subprocess.run([DDPTOP, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
