"""Many ranks on one supervisor: 256 synthetic ranks over the real wire, and ranks that misbehave."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
from support import run_ddptop, until
from synthetic import hello, step_record, synthetic_job

from ddptop.core import rundir, wire
from ddptop.core.model.job import JobState
from ddptop.supervisor.serving.hub import Hub

pytestmark = pytest.mark.slow  # hundreds of synthetic ranks: seconds each

RANKS, RATE, STEPS = 256, 10.0, 20


async def test_256_ranks_lose_nothing_and_all_are_in_the_export(ddptop_home, tmp_path):
    run = rundir.create(Path("synthetic.py"), tmp_path / "run")
    run.write_meta({"id": run.id, "script": "synthetic.py", "state": "running", "started": time.time()})
    hub = Hub(run, lambda command: None)
    await hub.start()
    hub.record({"type": "run", "wall": time.time(), "script": "synthetic.py"})
    sent = await asyncio.wait_for(synthetic_job(run.socket_path, RANKS, RATE, steps=STEPS, checksum_every=5), 60)
    await hub.finish(0)
    assert sent == [STEPS] * RANKS
    assert hub.collector.bad_frames == 0

    export = run_ddptop("export", str(run.path))
    assert export.returncode == 0, export.stderr
    steps: dict[int, list[int]] = {}
    for line in export.stdout.splitlines():
        record = json.loads(line)
        if record["type"] == "step":
            steps.setdefault(record["rank"], []).append(record["step"])
    assert sorted(steps) == list(range(RANKS))
    assert all(got == list(range(STEPS)) for got in steps.values())


async def test_a_rank_that_lies_is_counted_and_the_others_go_on(tmp_path):
    """Garbage, a second connection for a taken rank, steps that go back: data problems of that rank."""
    run = rundir.create(Path("synthetic.py"), tmp_path / "run")
    hub = Hub(run, lambda command: None)
    await hub.start()
    honest = asyncio.create_task(synthetic_job(run.socket_path, 4, RATE, steps=STEPS))

    async def connect(first: wire.Frame) -> asyncio.StreamWriter:
        _, writer = await asyncio.open_unix_connection(str(run.socket_path))
        writer.write(wire.encode(first))
        await writer.drain()
        return writer

    liar = await connect(hello(9, 12))
    rng = random.Random(0)
    records = [step_record(9, s, 100.0, rng) for s in (0, 1, 2, 1, 3)]  # step 1 again
    liar.write(wire.encode({"type": "batch", "items": records}))
    await liar.drain()
    twin = await connect(hello(9, 12))  # rank 9 is taken
    garbage = await connect(hello(10, 12))
    garbage.write(b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1")  # a frame msgpack cannot decode

    state: JobState = hub.state

    await until(
        lambda: state.ranks.get(9) and state.ranks[9].data_problems == 2 and state.ranks.get(10) and state.ranks[10].data_problems == 1,
        "the liar's and the garbage sender's problems counted",
    )
    assert await asyncio.wait_for(honest, 30) == [STEPS] * 4
    assert state.ranks[9].step == 3
    assert all(state.ranks[r].step == STEPS - 1 and state.ranks[r].data_problems == 0 for r in range(4))
    errors = [e for e in state.events if e["type"] == "wire_error"]
    assert {(e["rank"], e["error"].split(":")[0]) for e in errors} == {
        (9, "rank 9 (attempt 0) is already connected"),
        (10, "undecodable frame"),
    }
    for writer in (liar, twin, garbage):
        writer.close()
    await hub.finish(0)
