"""The collector on a real Unix socket: good records in, bad connections out."""

import asyncio
import struct

import pytest
from builders import hello
from support import until

from ddptop.core import wire
from ddptop.supervisor.serving.collector import Collector

HELLO = hello(2, 4, local_rank=0)
STEP = {"type": "step", "rank": 2, "step": 0, "wall": 1.0, "step_ms": 5.0}


@pytest.fixture
async def collector(tmp_path):
    records: list = []
    coll = Collector(records.append)
    path = tmp_path / "sock"
    await coll.start_unix(path)
    yield coll, path, records
    await coll.close(drain_s=0.1)


async def test_socket_is_private(collector):
    _, path, _ = collector
    assert path.stat().st_mode & 0o777 == 0o600


async def test_hello_and_batched_records_reach_the_sink(collector):
    _coll, path, records = collector
    _, writer = await asyncio.open_unix_connection(str(path))
    writer.write(wire.encode(HELLO) + wire.encode({"type": "batch", "items": [STEP, {**STEP, "step": 1}]}))
    await writer.drain()
    await until(lambda: len(records) == 3, "the records that were sent")
    assert records[0] == HELLO and [r["step"] for r in records[1:]] == [0, 1]
    writer.close()


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\x00\x00\x03\xc1\xc1\xc1",  # undecodable body
        struct.pack(">I", wire.MAX_FRAME + 1),  # oversized
        wire.encode(STEP),  # a record before any hello
        wire.encode(HELLO) + wire.encode({"type": "batch", "items": [{**STEP, "rank": 3}]}),  # spoofed rank
        wire.encode(HELLO) + wire.encode({"type": "batch", "items": [{**STEP, "step": "x"}]}),  # type-confused
    ],
)
async def test_a_bad_frame_closes_only_its_connection_and_is_counted(collector, payload):
    coll, path, records = collector
    _, good = await asyncio.open_unix_connection(str(path))
    good.write(wire.encode(HELLO))
    await until(lambda: HELLO in records, "the records that were sent")
    bad_reader, bad = await asyncio.open_unix_connection(str(path))
    bad.write(payload)
    await bad.drain()
    assert await asyncio.wait_for(bad_reader.read(), 5) == b""  # closed by the server
    assert coll.bad_frames == 1
    assert any(r["type"] == "wire_error" for r in records)
    good.write(wire.encode({"type": "batch", "items": [{**STEP, "step": 41}]}))
    await good.drain()
    await until(lambda: records[-1].get("step") == 41, "the records that were sent")
    good.close()
    bad.close()
