import io
import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddptop.core import wire

STEP = {"type": "step", "rank": 1, "step": 7, "wall": 1.5, "step_ms": 12.0, "samples": 32, "loss": None}


def test_round_trip_through_the_stream_decoder():
    frames = [STEP, {"type": "batch", "items": [STEP, STEP]}]
    data = b"".join(wire.encode(f) for f in frames)
    decoder = wire.FrameDecoder()
    got = []
    for i in range(0, len(data), 7):  # arbitrary split points, as a socket delivers
        got += decoder.feed(data[i : i + 7])
    assert got == frames
    assert all(wire.validate(f) for f in got)


@given(
    rank=st.integers(0, 1 << 20),
    step=st.integers(0, 1 << 40),
    step_ms=st.floats(allow_nan=False),
    loss=st.none() | st.floats(allow_nan=False),
)
def test_round_trip_of_any_step_record(rank, step, step_ms, loss):
    frame = {"type": "step", "rank": rank, "step": step, "wall": 0.0, "step_ms": step_ms, "loss": loss}
    (decoded,) = wire.FrameDecoder().feed(wire.encode(frame))
    assert wire.validate(decoded) == frame


def test_oversized_header_is_refused_before_the_body_arrives():
    decoder = wire.FrameDecoder()
    with pytest.raises(wire.FrameError, match="exceeds"):
        decoder.feed(struct.pack(">I", wire.MAX_FRAME + 1))


def test_encode_refuses_an_oversized_frame():
    with pytest.raises(wire.FrameError):
        wire.encode({"type": "step", "blob": b"x" * (wire.MAX_FRAME + 1)})


@pytest.mark.parametrize(
    "frame, message",
    [
        ({"type": "nope"}, "unknown frame type"),
        ({**STEP, "extra": 1}, "unknown field"),
        ({**STEP, "step": True}, "field 'step'"),
        ({**STEP, "step": "7"}, "field 'step'"),
        ({**STEP, "rank": None}, "field 'rank'"),
        ({"type": "step", "rank": 0}, "missing field"),
        ({"type": "batch", "items": [{"type": "rank_hello"}]}, "not a rank record"),
        ({"type": "batch", "items": [{**STEP, "step_ms": "x"}]}, "step_ms"),
        ({"type": "batch", "items": [STEP] * (wire.MAX_BATCH + 1)}, "exceeds"),
    ],
)
def test_schema_violations_are_named(frame, message):
    with pytest.raises(wire.FrameError, match=message):
        wire.validate(frame)


def test_garbage_and_non_map_bodies_are_frame_errors():
    for body in (b"\xc1\xc1\xc1", msgpack.packb([1, 2]), msgpack.packb({"type": 3})):
        with pytest.raises(wire.FrameError):
            wire.FrameDecoder().feed(struct.pack(">I", len(body)) + body)


def test_good_frames_before_a_bad_one_are_delivered_then_the_error():
    decoder = wire.FrameDecoder()
    good = {"type": "heartbeat", "rank": 1, "wall": 0.0, "phase": "data", "step": 3, "dropped": 0}
    assert decoder.feed(wire.encode(good) + struct.pack(">I", 1) + b"\xc1") == [good]
    with pytest.raises(wire.FrameError, match="undecodable"):
        decoder.raise_deferred()
    decoder.raise_deferred()  # raised once


def test_read_frames_stops_quietly_at_a_truncated_tail():
    data = wire.encode(STEP) + wire.encode(STEP)
    assert list(wire.read_frames(io.BytesIO(data[:-3]))) == [STEP]


def test_the_supervisor_s_own_records_fit_their_schemas():
    """Summary, alert (with each rule's details) and exit, as the supervisor makes them; the e2e tests check real logs."""
    from ddptop.core.model.history import unpack
    from ddptop.core.model.job import JobState
    from ddptop.supervisor.watching.verdict import Verdict

    state = JobState()
    state.ingest({"type": "rank_hello", "rank": 0, "local_rank": 0, "world_size": 1, "node": 0, "host": "h", "pid": 1, "restart": 0})
    state.ingest({"type": "step", "rank": 0, "step": 0, "wall": 1.0, "step_ms": 5.0, "samples": 8, "comm_ms": 1.0})
    state.ingest({"type": "step", "rank": 0, "step": 1, "wall": 2.0, "step_ms": 5.0, "samples": 8, "comm_ms": 1.0})
    assert wire.validate(state.totals().record(3.0))["metrics"]["samples_per_s"] == 8.0
    assert list(unpack(wire.validate(state.summary(3.0))["rank_step_ms"])) == [5.0]  # each rank's mean since the last one
    details: list[dict] = [
        {},
        {"checksums": {"0": "00ff", "1": "00fe"}},
        {"ratio": 2.5},
        {"exitcode": -9, "log": ["Traceback", "ValueError: x"], "traceback": None},
        {"exitcode": 1, "exit_status": 1},
    ]
    for detail in details:
        wire.validate(Verdict("kind", "text", ranks=[0], step=1, details=detail).record())
    wire.validate(Verdict("hang", "no step", ranks=[0, 1]).record())  # no single rank, no step
    wire.validate({"type": "exit", "wall": 4.0, "code": 0, "stopped_by_signal": None})
    with pytest.raises(wire.FrameError, match="metric 'x' is not a number"):
        wire.validate({**state.totals().record(3.0), "metrics": {"x": "fast"}})
