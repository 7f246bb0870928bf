"""The default process group's collective sequence numbers, read from torch's flight recorder.

The launcher turns the recorder on for every rank (env_for(), unless the
user set either name): torch 2.8 and later read TORCH_FR_BUFFER_SIZE (and
record gloo's collectives too) and warn on every rank that the older name,
TORCH_NCCL_TRACE_BUFFER_SIZE, is deprecated; earlier ones read only that.
Its status per group is what torch's own flight-recorder analysis matches
ranks by: the last collective each rank enqueued and completed. A rank
whose last enqueued collective is behind the others' never issued the one
they wait in.

Read on the sender thread, and only once the rank has sat on one step for
READ_AFTER_S: the status dump takes the recorder's lock for tens of
microseconds, which a rank that steps never pays. Never imports torch: a
script that has not imported torch.distributed has no group to read.
"""

from __future__ import annotations

import pickle
import sys

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
DEFAULT_GROUP = "0"
"""The status key of a process's first group: the default one, DDP's unless the script passes
another. Keys count the groups a process made, and are not reused: after a destroy and a new
init the default group is another key, and the verdict goes without the lag."""


def collectives() -> list[int] | None:
    """[last enqueued, last completed] collective of the default group; None without a recorder."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    from ddptop.trainer import torchapi  # torch.distributed is loaded, so torch is

    dump = torchapi.flight_recorder_dump()
    if dump is None:
        return None
    try:
        status = pickle.loads(dump(includeCollectives=False, includeStackTraces=False, onlyActive=True))["pg_status"][DEFAULT_GROUP]
        return [int(status["last_enqueued_collective"]), int(status["last_completed_collective"])]
    except Exception:  # noqa: BLE001 - no recorder, an older layout: the verdict goes without it
        return None
