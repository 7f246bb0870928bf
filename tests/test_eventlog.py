"""The event log rotated and compressed: export, replay and a dashboard's history still see every record."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from support import run_ddptop, until

from ddptop.core import rundir, wire
from ddptop.core.eventlog import EventLog, closed_segments, compress, open_segment, read_all
from ddptop.core.wire.stream import frames
from ddptop.supervisor.serving.hub import Hub


def heartbeat(n: int) -> dict:
    return {"type": "heartbeat", "rank": n % 8, "wall": float(n), "phase": "forward", "step": n, "dropped": 0}


def test_rotated_segments_are_compressed_and_read_back_in_order(ddptop_home, tmp_path):
    run = rundir.create(Path("train.py"), tmp_path / "run")
    run.write_meta({"id": run.id, "script": "train.py", "state": "finished", "started": time.time()})
    log = EventLog(run.events_path, segment_bytes=4096)
    for n in range(2000):
        log.append(heartbeat(n))
    log.close()
    segments = closed_segments(run.events_path)
    assert len(segments) >= 10 and all(p.name.endswith(".log.zst") for p in segments)
    assert not list(run.path.glob("events.*.log"))  # every closed segment compressed, the plain one gone
    assert sum(p.stat().st_size for p in segments) < 0.5 * 4096 * len(segments)
    assert [r["step"] for r in read_all(run.events_path)] == list(range(2000))

    export = run_ddptop("export", run.id)
    assert export.returncode == 0, export.stderr
    assert [json.loads(line)["step"] for line in export.stdout.splitlines()] == list(range(2000))


def test_a_segment_compressed_after_it_was_listed_is_still_read(tmp_path):
    log = EventLog(tmp_path / "events.log", segment_bytes=1 << 30)
    for n in range(100):
        log.append(heartbeat(n))
    log.close()
    plain = tmp_path / "events.000001.log"
    (tmp_path / "events.log").rename(plain)
    [listed] = closed_segments(tmp_path / "events.log")
    compress(plain)
    with open_segment(listed) as stream:
        assert stream.read() == b"".join(wire.encode(heartbeat(n)) for n in range(100))


async def test_a_viewer_asking_for_history_gets_every_rotated_record_then_the_live_ones(tmp_path):
    run = rundir.create(Path("train.py"), tmp_path / "run")
    hub = Hub(run, lambda command: None)
    hub.log.segment_bytes = 2048
    await hub.start()
    for n in range(500):
        hub.record(heartbeat(n))
    assert len(closed_segments(run.events_path)) >= 5
    reader, writer = await asyncio.open_unix_connection(str(run.socket_path))
    writer.write(wire.encode({"type": "viewer_hello", "history": True}))
    received: list[int] = []

    async def watch() -> None:
        async for record in frames(reader):
            received.append(record["step"])
            if len(received) == 600:
                return

    watcher = asyncio.create_task(watch())
    await until(lambda: hub.viewers.attached, "the viewer attached")
    for n in range(500, 600):
        hub.record(heartbeat(n))
    await asyncio.wait_for(watcher, 20)
    writer.close()
    await hub.finish(0)
    assert received == list(range(600))
