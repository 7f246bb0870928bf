"""The tests' fixtures: a private ddptop home for every test, a gloo world of one, a memory-limited
cgroup. What tests share beside fixtures is in support.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from ddptop.core import rundir


@pytest.fixture
def memory_limited_cgroup(tmp_path: Path) -> Iterator[Path]:
    """A memory cgroup of its own, a child of this process's, limited to 1.5 GiB: the folder whose
    cgroup.procs a process joins. Skips where none can be made (not root, no writable memory
    controller): the kernel's OOM killer cannot be called on otherwise."""
    from ddptop.supervisor.launching import oom_kills

    here = oom_kills.counter()
    if here is None:
        pytest.skip("no memory cgroup to count OOM kills in")
    child = here.parent / f"ddptop-test-{os.getpid()}-{tmp_path.name}"
    limit = str(1536 << 20)
    try:
        child.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        try:
            (child / ("memory.max" if here.name == "memory.events" else "memory.limit_in_bytes")).write_text(limit)
        except OSError as exc:
            pytest.skip(f"cannot limit a memory cgroup here: {exc}")
        yield child
    finally:
        wait_for(lambda: not (child / "cgroup.procs").read_text().strip(), 30, "the cgroup's processes to end")
        child.rmdir()


USERS_RUNS = rundir.runs_root()
"""The user's own run list, as it is before any test moves ddptop's state elsewhere."""


def _listing(folder: Path) -> set[str]:
    return set(os.listdir(folder)) if folder.is_dir() else set()


@pytest.fixture(scope="session", autouse=True)
def users_runs_untouched() -> Iterator[None]:
    """No test may add to the user's `ddptop ls`: the whole suite fails if one did."""
    before = _listing(USERS_RUNS)
    yield
    added = _listing(USERS_RUNS) - before
    if added:
        pytest.fail(f"tests wrote into the user's run list {USERS_RUNS}: {sorted(added)}")


@pytest.fixture(autouse=True)
def private_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test, and every process it starts, keeps ddptop's state in a folder of its own:
    a run a test makes (rundir.create links every run into the state root) is no user's."""
    monkeypatch.setenv("DDPTOP_HOME", str(tmp_path_factory.mktemp("ddptop-state")))


@pytest.fixture
def ddptop_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ddptop state root the test can look into (every test has one: private_state)."""
    home = tmp_path / "home"
    monkeypatch.setenv("DDPTOP_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def gloo_world_of_one() -> Iterator[None]:
    """A real process group of this process alone, on gloo: for the tests of ddptop's torch
    hooks in this process. torch is imported here, not above: the dashboard's tests import none."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
