"""The wire: every frame ddptop exchanges, and how it is laid out.

Ranks, the supervisor, the dashboards and the event log all speak it:
frames.py lays a frame out, schemas.py says what each record type may hold.
Callers import this package (`from ddptop.core import wire`); it loads only
the standard library and msgpack, since every training rank imports it.
"""

from ddptop.core.wire.frames import MAX_BATCH, MAX_FRAME, Frame, FrameDecoder, FrameError, encode, last_frame, read_frames
from ddptop.core.wire.records import Record
from ddptop.core.wire.schemas import AGENT_RECORD_TYPES, COMMANDS, FORWARDED_TYPES, RANK_RECORD_TYPES, SCHEMAS, validate

__all__ = [
    "AGENT_RECORD_TYPES",
    "COMMANDS",
    "FORWARDED_TYPES",
    "MAX_BATCH",
    "MAX_FRAME",
    "RANK_RECORD_TYPES",
    "SCHEMAS",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "Record",
    "encode",
    "last_frame",
    "read_frames",
    "validate",
]
