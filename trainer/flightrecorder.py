"""Where a rank stands in each process group's collectives, read from torch's flight recorder.

The launcher turns the recorder on for every rank (env_for(), unless the
user set either name): torch 2.8 and later read TORCH_FR_BUFFER_SIZE (and
record gloo's collectives too) and warn on every rank that the older name,
TORCH_NCCL_TRACE_BUFFER_SIZE, is deprecated; earlier ones read only that.
Its status per group is what torch's own flight-recorder analysis matches
ranks by: the last collective each rank enqueued and completed, with the
op and sizes of its entries. A rank whose last enqueued collective is
behind the others' never entered the one they wait in.

There are two recorders, and a group's entries are in one of them:
ProcessGroupNCCL records into NCCL's own, which only `_dump_nccl_trace`
reads; gloo (torch 2.8 and later) into the generic one, `_dump_fr_trace`.
Both are read, and each group is taken from the dump that holds it. NCCL
marks an entry completed as its watchdog sees the work finish, while the
status's last_completed_collective stays -1 unless timing is on
(TORCH_NCCL_ENABLE_TIMING): so a group's last completed collective is the
later of the status's and its entries' marked "completed".

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


def collectives() -> list[dict[str, Any]] | None:
    """Per process group this rank is in, the last collective it entered and completed
    (records.Collective); None when no recorder holds any."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    from ddptop.trainer import torchapi  # torch.distributed is loaded, so torch is

    groups: dict[str, dict[str, Any]] = {}
    for dump in torchapi.flight_recorder_dumps():  # NCCL's first: a group it holds is an NCCL group
        for found in recorded(_load(dump)):
            groups.setdefault(found["group"], found)
    return list(groups.values()) or None


def _load(dump: Callable[..., bytes]) -> dict[str, Any]:
    try:
        trace: dict[str, Any] = pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))
    except Exception:  # noqa: BLE001 - a recorder that is off or cannot dump: the verdict goes without it
        return {}
    return trace


def recorded(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """A dump's status of every group that entered a collective, with the op and size of
    each group's last entered collective; [] for a layout it cannot read."""
    try:
        last: dict[str, dict[str, Any]] = {}
        done: dict[str, int] = {}
        named: dict[str, str] = {}
        for entry in trace.get("entries", ()):
            if entry.get("is_p2p"):
                continue
            group = str(entry["pg_id"])
            if (name := (entry.get("process_group") or ("",))[0]) and isinstance(name, str):
                named[group] = name
            last[group] = entry  # entries are in the order they were made
            if entry.get("state") == "completed":
                done[group] = max(done.get(group, 0), int(entry["collective_seq_id"]))
        groups = []
        for group, status in trace.get("pg_status", {}).items():
            enqueued = int(status["last_enqueued_collective"])
            if enqueued <= 0:
                continue
            entry = last.get(group, {})
            # A pg_id counts the groups this rank is in; a group's name is the job's, the same on each of its ranks.
            name = named.get(group, group)
            found = {"group": name, "name": _name(name, entry), "enqueued": enqueued}
            found["completed"] = max(0, int(status["last_completed_collective"]), done.get(group, 0))
            if entry and entry.get("collective_seq_id") == enqueued:
                found["op"] = str(entry.get("profiling_name", "")).split(":")[-1]
                found["bytes"] = _nbytes(entry)
            groups.append(found)
        return groups
    except (KeyError, TypeError, ValueError, AttributeError):
        return []


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
