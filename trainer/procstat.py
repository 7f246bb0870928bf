"""Fields of /proc/self/stat, numbered as proc(5) numbers them (Linux only)."""

from __future__ import annotations


def stat_fields(*numbers: int) -> list[int] | None:
    """The numeric fields asked for (3 and up); None where /proc cannot say.

    The command name (field 2) may hold spaces and parentheses, so the fields
    are counted from its last ')'.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            rest = stat.read().rsplit(b")", 1)[1].split()
        return [int(rest[number - 3]) for number in numbers]
    except (OSError, ValueError, IndexError):
        return None
