"""How values read, on the dashboard and in the headless summary alike.

Each takes None for "not measured" and shows it as "-": a rank that has
not reported a figure yet is a normal state, not an error.
"""

from __future__ import annotations


def count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def nbytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
