"""How values read, on the dashboard and in the headless summary alike.

Each takes None for "not measured" and shows it as "-": a rank that has
not reported a figure yet is a normal state, not an error.
"""

from __future__ import annotations

from collections.abc import Callable


def count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def counted(number: int, noun: str) -> str:
    """ "1 alert", "2 alerts": a count with its noun, singular for one."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def bandwidth(value: float | None) -> str:
    """Bytes a second in decimal units, as nccl-tests reports its bus bandwidth ("12.3 GB/s")."""
    if value is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B/s"


def significant(digits: int) -> Callable[[float | None], str]:
    """A number to `digits` significant digits, trailing zeros kept, so rows line up in
    precision (2.200 beside 2.205, not 2.2): a loss or a norm, whatever its magnitude."""

    def text(value: float | None) -> str:
        if value is None:
            return "-"
        shown = f"{value:#.{digits}g}"
        return shown[:-1] if shown.endswith(".") else shown

    return text


def nbytes(value: float | None, like: float | None = None) -> str:
    """Bytes in the largest unit under 1024 of them; of `like`'s unit when given, so that the labels
    of one axis read in one unit ("0.9 GiB" beside "1.0 GiB", not "996.1 MiB" beside it)."""
    if value is None:
        return "-"
    scale = abs(value if like is None else like)
    for power, unit in enumerate(("B", "KiB", "MiB", "GiB")):
        if scale < 1024 ** (power + 1) or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value / 1024**power:.1f} {unit}"
    raise AssertionError("unreachable")


def span(seconds: float) -> str:
    """A length of time in the unit a person reads it in: "2.0 s", "84 s", "12 min", "3.5 h".
    Seconds alone read badly past a few minutes ("86400.0 s" for a day), and a whole number of
    them hides a part under one ("0 s" for 0.2 s)."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
