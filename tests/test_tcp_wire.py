"""The wire over TCP on real sockets: the token, and nodes joining the aggregator."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from support import until
from test_collector import HELLO, STEP

from ddptop.core import wire
from ddptop.core.usage import UsageError
from ddptop.supervisor.cluster import endpoints, uplink
from ddptop.supervisor.cluster.aggregator import Aggregator
from ddptop.supervisor.serving.collector import Collector

TOKEN = "s3cret"


def node_hello(node: int, nnodes: int = 3) -> dict:
    return {"type": "node_hello", "node": node, "nnodes": nnodes, "host": "h", "pid": 1}


@pytest.fixture
async def aggregator():
    """Node 0's collector with an aggregator as its node handler, listening on a free loopback port."""
    records: list = []
    coll = Collector(records.append)
    agg = Aggregator(records.append, node=0, nnodes=3, run_id="run0")
    coll.node_handler = agg.serve
    sock = endpoints.listen("127.0.0.1", 0, "test")
    await coll.start_tcp(sock, TOKEN)
    yield coll, sock.getsockname()[1], records, agg
    await coll.close(drain_s=0.1)


async def exchange(port: int, payload: bytes) -> list[dict]:
    """Send payload, read what comes back until the server closes (or 2 s pass)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    decoder, frames = wire.FrameDecoder(), []
    try:
        while data := await asyncio.wait_for(reader.read(1 << 16), 2.0):
            frames += decoder.feed(data)
    except asyncio.TimeoutError:
        pass
    writer.close()
    return frames


def errors(records: list) -> list[str]:
    return [r["error"] for r in records if r["type"] == "wire_error"]


@pytest.mark.parametrize(
    "first, reason",
    [
        ({"type": "viewer_hello"}, "no token (the first frame was 'viewer_hello')"),
        ({"type": "auth", "token": "guess"}, "wrong token"),
        ({"type": "auth", "token": 7}, "wrong token"),
    ],
)
async def test_a_connection_without_the_token_is_refused_told_and_logged(aggregator, first, reason):
    coll, port, records, agg = aggregator
    frames = await exchange(port, wire.encode(first) + wire.encode(node_hello(1)))
    assert frames == [{"type": "refused", "reason": reason}]
    await until(lambda: errors(records), "the refusal logged")
    assert errors(records)[0].startswith("refused a TCP connection from 127.0.0.1:") and errors(records)[0].endswith(reason)
    assert coll.bad_frames == 1 and agg.remote_ranks(1) == set()


async def test_ranks_do_not_connect_over_tcp(aggregator):
    _, port, records, _ = aggregator
    await exchange(port, wire.encode({"type": "auth", "token": TOKEN}) + wire.encode(HELLO))
    await until(lambda: errors(records), "the refusal logged")
    assert errors(records) == ["over TCP only dashboards and nodes connect, not 'rank_hello'"]
    assert HELLO not in records


async def test_nodes_join_once_each_and_forward_their_ranks_records(aggregator):
    _coll, port, records, agg = aggregator
    auth = wire.encode({"type": "auth", "token": TOKEN})
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(auth + wire.encode(node_hello(1)) + wire.encode(HELLO) + wire.encode(STEP))
    decoder = wire.FrameDecoder()
    assert decoder.feed(await reader.read(1 << 16)) == [{"type": "node_welcome", "node": 1, "run": "run0"}]
    await until(lambda: STEP in records, "the forwarded step")
    assert agg.owner(2) == 1 and agg.owner(0) is None
    for node, reason in (
        (1, "node rank 1 is already taken by h"),
        (0, "node rank 0 is the aggregator's own"),
        (5, "node rank 5 is outside --nnodes 3"),
    ):
        assert await exchange(port, auth + wire.encode(node_hello(node, nnodes=3))) == [{"type": "refused", "reason": reason}]
    assert await exchange(port, auth + wire.encode(node_hello(2, nnodes=2))) == [
        {"type": "refused", "reason": "node 2 says --nnodes 2, the job has 3"}
    ]
    # A command for that node's rank goes back over its connection.
    assert agg.command(1, {"type": "command", "action": "kill_rank", "rank": 2})
    assert decoder.feed(await reader.read(1 << 16)) == [{"type": "command", "action": "kill_rank", "rank": 2}]
    writer.close()
    await until(
        lambda: {"type": "rank_gone", "rank": 2} in [{k: r[k] for k in ("type", "rank")} for r in records if r["type"] == "rank_gone"],
        "the node's rank gone with it",
    )


async def test_a_node_forwards_records_only_not_commands(aggregator):
    _, port, records, _ = aggregator
    stop = {"type": "command", "action": "stop"}
    await exchange(port, wire.encode({"type": "auth", "token": TOKEN}) + wire.encode(node_hello(1)) + wire.encode(stop))
    await until(lambda: errors(records), "the refusal logged")
    assert errors(records) == ["node 1 forwarded a 'command' record"]


async def test_join_is_welcomed_or_refused_in_one_line(aggregator):
    _, port, _, _ = aggregator
    sock = await asyncio.to_thread(uplink.join, "127.0.0.1", port, TOKEN, node_hello(1, nnodes=3), 5.0)
    try:
        with pytest.raises(UsageError, match="refused node 1: node rank 1 is already taken by h"):
            await asyncio.to_thread(uplink.join, "127.0.0.1", port, TOKEN, node_hello(1, nnodes=3), 5.0)
        with pytest.raises(UsageError, match="refused node 2: wrong token"):
            await asyncio.to_thread(uplink.join, "127.0.0.1", port, "guess", node_hello(2, nnodes=3), 5.0)
    finally:
        sock.close()


def test_the_token_file_is_private(tmp_path):
    path = tmp_path / "token"
    endpoints.write_token(path, "abc")
    assert os.stat(path).st_mode & 0o777 == 0o600 and endpoints.read_token(path) == "abc"


def test_listen_parses_ports_and_hosts():
    assert endpoints.parse("9000") == ("127.0.0.1", 9000)
    assert endpoints.parse("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert endpoints.parse("[::1]:9000") == ("::1", 9000)
    with pytest.raises(UsageError, match="out of range"):
        endpoints.parse("70000")
    with socket.create_server(("127.0.0.1", 0)) as taken, pytest.raises(UsageError, match="Address already in use"):
        endpoints.listen("127.0.0.1", taken.getsockname()[1], "x")
