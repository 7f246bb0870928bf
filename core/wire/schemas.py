"""The check of every frame ddptop exchanges, derived from its typed definition (records.py).

Every frame from a peer is checked here after decoding (frames.py), so
nothing malformed reaches the collector; the records the supervisor makes
itself (run, alert, summary, exit) are defined too, so the event log a
replay or `ddptop export` reads is described in one place.
"""

from __future__ import annotations

import types
import typing
from typing import cast

from ddptop.core.wire import records
from ddptop.core.wire.frames import MAX_BATCH, Frame, FrameError
from ddptop.core.wire.records import NotRequired

# Field specs: (accepted Python types, required). bool is excluded from the
# numeric types explicitly because msgpack decodes true/false as bool, a
# subclass of int, and a type-confused peer must not pass as a step number.
_INT = (int,)
_NUM = (int, float)
_STR = (str,)
_BOOL = (bool,)
_LIST = (list,)
_MAP = (dict,)
_BYTES = (bytes,)

Spec = tuple[tuple[type, ...], bool]
"""A field's check: (the Python types its value may have, whether it is required)."""

_TYPES: dict[object, tuple[type, ...]] = {int: _INT, float: _NUM, str: _STR, bool: _BOOL, list: _LIST, dict: _MAP, bytes: _BYTES}


def schema_of(definition: type) -> dict[str, Spec]:
    """A record's field checks, from its typed definition (records.py)."""
    required = definition.__required_keys__  # type: ignore[attr-defined]
    return {name: (_TYPES[_base(hint)], name in required) for name, hint in typing.get_type_hints(definition).items() if name != "type"}


def _base(hint: object) -> object:
    """int for int, NotRequired[int] (which Python 3.10's get_type_hints leaves on) and
    int | None (a field told as None when unknown), str for a Literal of strings, list for
    list[str]."""
    if typing.get_origin(hint) is NotRequired:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is typing.Literal:  # a command's action: its values are checked apart
        hint = type(typing.get_args(hint)[0])
    return typing.get_origin(hint) or hint


SCHEMAS: dict[str, dict[str, Spec]] = {kind: schema_of(definition) for kind, definition in records.RECORDS.items()}
_SAMPLE_PROC = schema_of(records.SampleProc)
_SAMPLE_GPU = schema_of(records.SampleGpu)
_COLLECTIVE = schema_of(records.Collective)

COMMANDS = frozenset(typing.get_args(records.CommandAction))
"""Actions a viewer may request: stop the job, restart the group, kill one rank
(and, from the aggregator to a node, collect stacks)."""

RANK_RECORD_TYPES = frozenset({"step", "heartbeat", "exception", "checkpoint", "resume", "phase", "rank_note", "profile"})
"""What a batch from a rank may carry."""

AGENT_RECORD_TYPES = frozenset({"worker_failure", "group_restart", "agent_phase", "agent_note"})
"""What torchrun's probe may send after its hello."""

FORWARDED_TYPES = (
    RANK_RECORD_TYPES
    | AGENT_RECORD_TYPES
    | frozenset({"rank_hello", "rank_gone", "sample", "stack", "log_tail", "action", "notice", "wire_error", "capture"})
)
"""What a node's supervisor forwards to the aggregator: its ranks' and its
torchrun's records, and what it measured and did; not its own summaries."""


_REQUIRED = {kind: frozenset(k for k, (_, required) in schema.items() if required) for kind, schema in SCHEMAS.items()}
_PROC_REQUIRED = frozenset(k for k, (_, required) in _SAMPLE_PROC.items() if required)
_GPU_REQUIRED = frozenset(k for k, (_, required) in _SAMPLE_GPU.items() if required)
_COLLECTIVE_REQUIRED = frozenset(k for k, (_, required) in _COLLECTIVE.items() if required)


def validate(frame: Frame) -> records.Record:
    """Check a frame from an untrusted peer against its schema; return it as the record it is.

    Run on every record a supervisor receives (ten thousand a second at
    1,024 ranks), so the common case is one dict lookup and one isinstance
    per field.
    """
    kind = frame.get("type")
    if not isinstance(kind, str) or (schema := SCHEMAS.get(kind)) is None:
        raise FrameError(f"unknown frame type {kind!r}")
    _check_fields(kind, schema, frame, _REQUIRED[kind])
    if kind == "command":
        if frame["action"] not in COMMANDS:
            raise FrameError(f"unknown command {frame['action']!r}")
        if any(not isinstance(r, int) or isinstance(r, bool) for r in frame.get("ranks") or []):
            raise FrameError("command: ranks must be integers")
    elif kind == "batch":
        items = frame["items"]
        if len(items) > MAX_BATCH:
            raise FrameError(f"batch of {len(items)} records exceeds {MAX_BATCH}")
        for item in items:
            if not isinstance(item, dict) or item.get("type") not in RANK_RECORD_TYPES:
                raise FrameError("batch item is not a rank record")
            validate(item)
    elif kind == "log_tail":
        if any(not isinstance(line, str) for line in frame["lines"]):
            raise FrameError("log_tail: lines must be strings")
    elif kind == "heartbeat":
        if any(not isinstance(line, str) for line in frame.get("stack") or ()):
            raise FrameError("heartbeat: stack lines must be strings")
        for entry in frame.get("collectives") or ():
            if not isinstance(entry, dict):
                raise FrameError("heartbeat: an entry of collectives is not a map")
            _check_fields("heartbeat collectives", _COLLECTIVE, entry, _COLLECTIVE_REQUIRED)
    elif kind == "summary":
        for key, value in frame["metrics"].items():
            if not isinstance(key, str) or not (value is None or (isinstance(value, _NUM) and value.__class__ is not bool)):
                raise FrameError(f"summary: metric {key!r} is not a number")
    elif kind == "sample":
        for key, entry_schema, required in (("procs", _SAMPLE_PROC, _PROC_REQUIRED), ("gpus", _SAMPLE_GPU, _GPU_REQUIRED)):
            for entry in frame[key]:
                if not isinstance(entry, dict):
                    raise FrameError(f"sample: an entry of {key} is not a map")
                _check_fields(f"sample {key}", entry_schema, entry, required)
    return cast(records.Record, frame)


def _check_fields(kind: str, schema: dict[str, Spec], frame: Frame, required: frozenset[str]) -> None:
    for key, value in frame.items():
        spec = schema.get(key)
        if spec is None:
            if key == "type":
                continue
            raise FrameError(f"{kind}: unknown field {key!r}")
        types = spec[0]
        if not isinstance(value, types) or (value.__class__ is bool and bool not in types):
            if value is None and not spec[1]:
                continue
            raise FrameError(f"{kind}: field {key!r} has type {type(value).__name__}")
    if not required <= frame.keys():
        missing = sorted(required - frame.keys())
        raise FrameError(f"{kind}: missing field(s) {', '.join(missing)}")
