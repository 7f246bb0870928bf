"""How many processes of a cgroup the kernel's OOM killer has killed: whether a worker died of memory.

A rank killed by SIGKILL, or one whose DataLoader worker was ("DataLoader
worker is killed by signal: Killed"), most often ran its host or its
container out of memory, and nothing in its exit says so. The kernel counts
every process its OOM killer kills, whether the whole host or a cgroup's
limit ran out, in the victim's memory cgroup: `oom_kill` in memory.events
(cgroup v2) or memory.oom_control (v1). torchrun's workers are in its own
cgroup, so torchrun's probe reads that count when the workers start and
again when one fails.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def counter(pid: int | str = "self", root: Path = CGROUP_ROOT) -> Path | None:
    """The file that holds the OOM kill count of pid's memory cgroup; None where there is none
    (not Linux, no memory controller mounted where it usually is)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if number == "0" and controllers == "":  # cgroup v2: unified, or unified beside v1 (hybrid)
            candidates = [root / relative / "memory.events", root / "unified" / relative / "memory.events"]
        elif "memory" in controllers.split(","):
            candidates = [root / "memory" / relative / "memory.oom_control"]
        else:
            continue
        for candidate in candidates:
            if candidate.is_file() and count(candidate) is not None:
                return candidate
    return None


def count(path: Path | None) -> int | None:
    """The `oom_kill` count the file holds; None where it cannot be read (a kernel before 4.13)."""
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None
