"""What the tests share beside their fixtures: real processes, real sockets, waits on conditions
with deadlines, and where the scripts and the example job are."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddptop.core import rundir, wire
from ddptop.core.model.job import JobState
from ddptop.core.wire import unixpath

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # the synthetic-rank load generator


DDPTOP = str(Path(sys.executable).parent / "ddptop")


EXAMPLE = REPO / "examples" / "train.py"


SCRIPTS = REPO / "tests" / "scripts"


def bound_unix(path: Path) -> socket.socket:
    """A Unix socket bound at path as ddptop binds its own, through unixpath: a test's temporary
    folder (a pytest-xdist worker's is a level deeper) can be longer than AF_UNIX allows."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with unixpath.usable(str(path)) as short:
        sock.bind(short)
    return sock


def received(connection: socket.socket) -> Iterator[wire.Frame]:
    """The frames a listener reads from one rank's connection, until the rank ends it (60 s at most a read)."""
    connection.settimeout(60)
    decoder = wire.FrameDecoder()
    while data := connection.recv(65536):
        yield from decoder.feed(data)


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


def counts_storage_bytes(folder: Path) -> bool:
    """Whether this kernel counts a process's storage bytes (task I/O accounting), as the sampler
    reads them: a write into folder shows in this process's write_bytes."""
    import psutil

    try:
        before = psutil.Process().io_counters().write_bytes
    except (AttributeError, NotImplementedError, psutil.AccessDenied):
        return False
    (folder / "storage-probe").write_bytes(bytes(1 << 20))
    return psutil.Process().io_counters().write_bytes > before


def recorded(run: rundir.RunDir) -> list[wire.Frame]:
    """Every record of a run's event log, each checked against its type's schema (the supervisor's own too)."""
    records = list(rundir.read_events(run))
    for record in records:
        wire.validate(record)
    return records


def counted_once_a_group(records: list[wire.Frame], ranks: int, groups: int) -> None:
    """Folded as a dashboard folds them, the job's samples/s is its ranks' over the groups of
    ranks that see the same samples (pipeline stages, tensor-parallel shards): each sample once.
    The ranks have told whom they are data-parallel with."""
    from ddptop.core.model.job import JobState
    from ddptop.core.model.metrics import SAMPLES_PER_S

    state = JobState()
    for record in records:
        state.ingest(record)
    assert all(state.ranks[r].replicas is not None for r in range(ranks))
    rates = [SAMPLES_PER_S.read(state.ranks[r]) for r in range(ranks)]
    assert state.totals().of(SAMPLES_PER_S) == pytest.approx(sum(rates) / groups)


def fully_shard_ignores() -> bool:
    """Whether this torch's fully_shard takes ignored_params (since torch 2.7)."""
    import inspect

    fully_shard = getattr(__import__("torch.distributed.fsdp").distributed.fsdp, "fully_shard", None)
    return fully_shard is not None and "ignored_params" in inspect.signature(fully_shard).parameters


def norms_added_up(records: list[wire.Frame]) -> dict[int, float]:
    """step -> the job's grad norm, as the job model adds it up from the ranks' shares."""
    state, out = JobState(), {}
    for record in records:
        state.ingest(record)
        if state.sharded_norm.latest is not None:
            step, norm = state.sharded_norm.latest
            out[step] = norm
    return out


def accumulating_step(model: Any, optimizer: Any, x: Any, micro_batches: int = 3) -> None:
    """One optimizer step over micro-batches, as gradient accumulation runs it: every one but
    the last under DDP's no_sync, so that DDP times and all-reduces the last alone."""
    for _ in range(micro_batches - 1):
        with model.no_sync():
            model(x).pow(2).mean().backward()
    model(x).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def run_ddptop(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the installed `ddptop` command as a user would."""
    return subprocess.run([DDPTOP, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def free_port(pair: bool = False) -> int:
    """A free loopback port (and, with pair, the next one free too: node 0's supervisor takes it)."""
    while True:
        with socket.create_server(("127.0.0.1", 0)) as sock:
            port = sock.getsockname()[1]
        if not pair or port >= 65535:
            return port
        try:
            socket.create_server(("127.0.0.1", port + 1)).close()
            return port
        except OSError:
            continue
