"""Records for tests, built from their typed definitions (core/wire/records.py).

A test gives the fields it is about; every other required field gets a
plain value of its declared type, so a record type that gains a required
field changes here, not in every test. What is built is checked as a peer's
record would be: a test cannot feed the model a record no rank could send.
"""

from __future__ import annotations

import copy
from typing import Any

from ddptop.core.wire import validate
from ddptop.core.wire.schemas import SCHEMAS

_PLAIN: dict[type, Any] = {int: 0, float: 0.0, str: "", bool: False, list: [], dict: {}, bytes: b""}


def build(kind: str, **fields: Any) -> dict[str, Any]:
    """A valid record of this kind: the fields given, the other required ones plain."""
    record: dict[str, Any] = {"type": kind}
    for name, (types, required) in SCHEMAS[kind].items():
        if required and name not in fields:
            record[name] = copy.copy(_PLAIN[types[-1]])
    record.update(fields)
    return validate(record)


def hello(rank: int, world: int = 1, **fields: Any) -> dict[str, Any]:
    """A rank's hello, on node 0 with local rank = rank unless given."""
    return build("rank_hello", **{"rank": rank, "local_rank": rank, "world_size": world, "host": "h", "pid": 100 + rank, **fields})


def step(rank: int, n: int, **fields: Any) -> dict[str, Any]:
    """A step record of 10 ms unless given."""
    return build("step", **{"rank": rank, "step": n, "step_ms": 10.0, **fields})


def steps_made(tracker: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step records a rank's StepTracker emitted into records, its last step's included: that
    step closes as a next forward begins, and then what is held is sent (flush, as at exit)."""
    tracker.forward_begin(None)
    tracker.flush()
    return [r for r in records if r["type"] == "step"]
