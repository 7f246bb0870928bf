"""Where a rank stands in each process group's collectives, read from torch's flight recorder.

The launcher turns the recorder on for every rank (env_for(), unless the
user set either name): torch 2.8 and later read TORCH_FR_BUFFER_SIZE (and
record gloo's collectives too) and warn on every rank that the older name,
TORCH_NCCL_TRACE_BUFFER_SIZE, is deprecated; earlier ones read only that.
Its status per group is what torch's own flight-recorder analysis matches
ranks by: the last collective each rank enqueued and completed, with the
op and sizes of its entries. A rank whose last enqueued collective is
behind the others' never entered the one they wait in. Without a recorder,
ddptop's own comm hook counts DDP's gradient all-reduces (CommHookCount).

Read on the sender thread, and only once the rank has sat on one step for
READ_AFTER_S: the status dump takes the recorder's lock for tens of
microseconds, which a rank that steps never pays. Never imports torch: a
script that has not imported torch.distributed has no group to read.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from typing import Any

from ddptop.core.wire.records import DEFAULT_GROUP

FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_ENTRIES = "2000"
"""Collectives the recorder keeps per rank: torch's own suggestion for debugging hangs."""
NEW_NAME_SINCE = (2, 8)


def env_for(torch_version: str | None) -> dict[str, str]:
    """The variable that turns the recorder on in ranks running this torch ("2.13.0+cpu")."""
    try:
        major, minor = (int(part) for part in (torch_version or "").split(".")[:2])
    except ValueError:
        return {FR_ENV[0]: FR_ENTRIES}  # a version we cannot read is a new one
    return {FR_ENV[0] if (major, minor) >= NEW_NAME_SINCE else FR_ENV[1]: FR_ENTRIES}


READ_AFTER_S = 5.0

_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1, "Bool": 1}


class CommHookCount:
    """DDP's gradient all-reduces as ddptop's own comm hook counts them (hooks.py): the
    collectives a rank without a flight recorder (torch before 2.8 on gloo, or the recorder
    turned off) can still report. Written by the training thread and gloo's, read by the sender."""

    def __init__(self) -> None:
        self.entered = 0
        self.completed = 0
        self.last: Any = None
        """The buffer of the bucket entered last: its size is read only when it is reported."""


COMM_HOOK = CommHookCount()


def collectives() -> list[dict[str, Any]] | None:
    """Per process group this rank is in, the last collective it entered and completed
    (records.Collective); None when nothing counts them."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    from ddptop.trainer import torchapi  # torch.distributed is loaded, so torch is

    recorded = _recorded(torchapi.flight_recorder_dump())
    if recorded:
        return recorded
    if COMM_HOOK.entered == 0:
        return None
    hook = COMM_HOOK
    return [
        {
            "group": "ddp",
            "name": "DDP's gradient all-reduces",
            "enqueued": hook.entered,
            "completed": hook.completed,
            "op": "all_reduce",
            "bytes": 0 if hook.last is None else int(hook.last.nbytes),
        }
    ]


def _recorded(dump: Callable[..., bytes] | None) -> list[dict[str, Any]] | None:
    """The recorder's status of every group, with the op and size of each group's last entered collective."""
    if dump is None:
        return None
    try:
        trace = pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))
        last: dict[str, dict[str, Any]] = {}
        for entry in trace.get("entries", ()):
            if not entry.get("is_p2p"):
                last[str(entry["pg_id"])] = entry  # entries are in the order they were made
        groups = []
        for group, status in trace["pg_status"].items():
            entry = last.get(group, {})
            found = {"group": group, "name": _name(group, entry), "enqueued": int(status["last_enqueued_collective"])}
            found["completed"] = max(0, int(status["last_completed_collective"]))
            if entry and entry.get("collective_seq_id") == found["enqueued"]:
                found["op"] = str(entry.get("profiling_name", "")).split(":")[-1]
                found["bytes"] = _nbytes(entry)
            groups.append(found)
        return groups
    except Exception:  # noqa: BLE001 - no recorder, an older layout: the verdict goes without it
        return None


def _name(group: str, entry: dict[str, Any]) -> str:
    if group == DEFAULT_GROUP:
        return "default group"
    desc = (entry.get("process_group") or ("", ""))[1]
    return f"group {group}" + (f" ({desc})" if desc and desc != "undefined" else "")


def _nbytes(entry: dict[str, Any]) -> int:
    sizes, dtypes = entry.get("input_sizes") or [], entry.get("input_dtypes") or []
    total = 0
    for shape, dtype in zip(sizes, dtypes):
        count = 1
        for dim in shape:
            count *= int(dim)
        total += count * _DTYPE_BYTES.get(dtype, 4)
    return total
