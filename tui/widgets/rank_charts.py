"""One rank's charts for its detail screen: its step and comm time over the run beside the job's.

Drawn from the same history as the main screen's charts, so a rank's line
here is the one it has in the ranks' chart, at the same resolution.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ddptop.core.format import ms
from ddptop.core.model.history import Point
from ddptop.tui.widgets.chart import Drawing, Line
from ddptop.tui.widgets.time_axis import Window


def _line(label: str, win: Window, value: Callable[[Point], float | None]) -> Line:
    xs, ys = [], []
    for point in win.points:
        y = value(point)
        if y is not None and math.isfinite(y):
            xs.append(win.x(point.wall))
            ys.append(y)
    return Line(label, xs, ys)


def _drawing(title: str, series: str, job_key: str, win: Window, rank: int) -> Drawing:
    lines = [
        _line(f"rank {rank}", win, lambda p: p.rank_value(series, rank)),
        _line("job median", win, lambda p: p.job.get(job_key)),
    ]
    return Drawing(title, lines, win, lambda v: f"{ms(v)} ms", missing=f"no {title} recorded for this rank yet")


def step_drawing(win: Window, rank: int) -> Drawing:
    return _drawing("step time", "step_ms", "step_ms_p50", win, rank)


def comm_drawing(win: Window, rank: int) -> Drawing:
    return _drawing("comm wait", "comm_ms", "comm_ms", win, rank)
