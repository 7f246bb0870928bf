"""Random, truncated, oversized and type-confused frames thrown at a live supervisor.

A real 2-rank job runs while hypothesis sends bad payloads to the
supervisor's Unix socket and to its TCP wire (without the token, and with
it). The supervisor must stay up, refuse every complete bad frame (a
wire_error record each), and the job's event log must still hold every
step of every rank.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import DDPTOP, EXAMPLE, run_ddptop, wait_for

from ddptop.core import rundir, wire
from ddptop.core.wire import unixpath

pytestmark = pytest.mark.slow

STEPS = 1500
HELLO = {"type": "rank_hello", "rank": 0, "local_rank": 0, "world_size": 2, "node": 0, "host": "h", "pid": 1, "restart": 0}
VALID = [
    HELLO,
    {"type": "step", "rank": 0, "step": 1, "wall": 1.0, "step_ms": 2.0},
    {"type": "heartbeat", "rank": 0, "wall": 1.0, "phase": "data", "step": 1, "dropped": 0},
    {"type": "viewer_hello", "history": False},
    {"type": "command", "action": "kill_rank", "rank": 0},
    {"type": "node_hello", "node": 1, "nnodes": 2, "host": "h", "pid": 1},
    {"type": "batch", "items": [{"type": "step", "rank": 0, "step": 1, "wall": 1.0, "step_ms": 2.0}]},
]
ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@st.composite
def type_confused(draw: st.DrawFn) -> bytes:
    """A known frame with one field's value of a type its schema refuses."""
    frame = dict(draw(st.sampled_from(VALID)))
    key = draw(st.sampled_from(sorted(k for k in frame if k != "type")))
    allowed = wire.SCHEMAS[frame["type"]][key][0]
    frame[key] = draw(ANY.filter(lambda v: v is not None and (not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed))))
    return wire.encode(frame)


PAYLOADS = st.one_of(
    st.binary(min_size=1, max_size=512),  # random bytes
    st.sampled_from(VALID).flatmap(lambda f: st.integers(1, len(wire.encode(f)) - 1).map(lambda n: wire.encode(f)[:n])),  # truncated
    st.integers(wire.MAX_FRAME + 1, 2**32 - 1).map(lambda n: struct.pack(">I", n) + b"\x80" * 16),  # oversized
    type_confused(),
    type_confused().map(lambda bad: wire.encode({**HELLO, "rank": 7, "restart": 9}) + bad),  # garbage after a hello
    ANY.map(lambda v: _packb(v)),  # msgpack that is not a frame
)


def _packb(value: object) -> bytes:
    import msgpack

    body = msgpack.packb(value, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def send(target: tuple[str, object], payload: bytes) -> None:
    kind, where = target
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with unixpath.usable(str(where)) as short:
            sock.connect(short)
    else:
        sock = socket.create_connection(where, timeout=5)
    with sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(5)
            while sock.recv(1 << 16):  # until the supervisor closes: it has judged the payload
                pass
        except OSError:
            pass  # the supervisor may close before reading everything we sent


def test_bad_frames_never_hurt_the_supervisor_or_the_job(ddptop_home, tmp_path):
    run_path = tmp_path / "run"
    job = subprocess.Popen(
        # Steps enough to outlast any fuzzing, however slow the machine: stopped when the fuzzing is done.
        [DDPTOP, "launch", "--headless", "--listen", "0", "--run-dir", str(run_path), str(EXAMPLE), "--gpus", "2", "--steps", "100000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = rundir.RunDir(run_path)
    meta = wait_for(
        lambda: run.meta_path.exists() and run.socket_path.exists() and json.loads(run.meta_path.read_text()), 60, "the run's socket"
    )
    host, port = meta["listen"].rsplit(":", 1)
    token = (run_path / "token").read_text().strip()
    targets: dict[str, tuple[str, object]] = {"unix": ("unix", run.socket_path), "tcp": ("tcp", (host, int(port)))}
    tried = {"payloads": 0, "bytes": 0}
    started = time.monotonic()

    @settings(max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(payloads=st.lists(PAYLOADS, min_size=1, max_size=8), target=st.sampled_from(["unix", "tcp", "tcp+token"]))
    def throw(payloads: list[bytes], target: str) -> None:
        for payload in payloads:
            if target == "tcp+token":
                send(targets["tcp"], wire.encode({"type": "auth", "token": token}) + payload)
            else:
                send(targets[target], payload)
            tried["payloads"] += 1
            tried["bytes"] += len(payload)
        assert job.poll() is None, "the supervisor died"

    throw()
    fuzz_s = time.monotonic() - started
    wait_for(lambda: sum(1 for r in rundir.read_events(run) if r["type"] == "step") >= 2 * STEPS, 300, f"{STEPS} steps", interval=0.5)
    assert run_ddptop("stop", str(run_path)).returncode == 0
    _out, err = job.communicate(timeout=300)
    assert job.returncode == 143, err[-3000:]  # stopped, as asked
    records = list(rundir.read_events(run))
    refused = [r for r in records if r["type"] == "wire_error"]
    steps = {(r["rank"], r["step"]) for r in records if r["type"] == "step" and r["rank"] in (0, 1)}
    last = min(max(step for rank, step in steps if rank == r) for r in (0, 1))
    print(
        f"\nfuzz: {tried['payloads']} bad payloads ({tried['bytes']:,} bytes) in {fuzz_s:.1f} s while the job ran; "
        f"{len(refused)} refused as bad frames; the job's log holds every one of its {len(steps)} steps"
    )
    assert last >= STEPS - 1 and steps >= {(rank, step) for rank in (0, 1) for step in range(last + 1)}  # none lost
    assert len(refused) >= tried["payloads"] // 3  # truncated and frameless payloads end without a complete frame to refuse
    assert "Traceback" not in err
