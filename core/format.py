"""How values read, on the dashboard and in the headless summary alike.

Each takes None for "not measured" and shows it as "-": a rank that has
not reported a figure yet is a normal state, not an error.
"""

from __future__ import annotations

from collections.abc import Callable


def count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def significant(digits: int) -> Callable[[float | None], str]:
    """A number to `digits` significant digits, trailing zeros kept, so rows line up in
    precision (2.200 beside 2.205, not 2.2): a loss or a norm, whatever its magnitude."""

    def text(value: float | None) -> str:
        if value is None:
            return "-"
        shown = f"{value:#.{digits}g}"
        return shown[:-1] if shown.endswith(".") else shown

    return text


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
