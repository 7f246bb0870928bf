"""One rank's charts for its detail screen: its step and comm time over the run beside the job's.

Drawn from the same history as the main screen's charts, so a rank's line
here is the one it has in the ranks' chart, at the same resolution.
"""

from __future__ import annotations

from ddptop.tui.widgets.chart import Drawing, line_of, ms_label
from ddptop.tui.widgets.time_axis import Window


def _drawing(title: str, series: str, job_key: str, win: Window, rank: int) -> Drawing:
    lines = [
        line_of(f"rank {rank}", win, (p.rank_value(series, rank) for p in win.points)),
        line_of("job median", win, (p.job.get(job_key) for p in win.points)),
    ]
    return Drawing(title, lines, win, ms_label, missing=f"no {title} recorded for this rank yet")


def step_drawing(win: Window, rank: int) -> Drawing:
    return _drawing("step time", "step_ms", "step_ms_p50", win, rank)


def comm_drawing(win: Window, rank: int) -> Drawing:
    return _drawing("comm wait", "comm_ms", "comm_ms", win, rank)
