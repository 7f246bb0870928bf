"""The main screen's charts: one per chart name of the metric table, and the ranks over time.

Job charts draw the history's per-second summaries (model/history.py), so
launch, attach and replay draw the same points. The ranks' chart draws each
rank's own work (its data wait and compute, model/lag.py) over time: a line per rank
up to LINES_UP_TO ranks, a heatmap beyond. Redrawn once a second, not per
frame: plotting is the costliest thing the dashboard does.

How many charts show is the app's call (it knows what the rank table
needs): `place(rows, width, many_ranks)` lays them out in two rows, one row of the
most useful few, or none.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from textual.app import ComposeResult
from textual.containers import Grid, Vertical
from textual.widgets import Static

from ddptop.core.format import nbytes
from ddptop.core.model.job import JobState
from ddptop.core.model.lag import DATA_ALONE, counts_compute, peer_groups
from ddptop.core.model.metrics import Metric, grouped
from ddptop.core.model.stats import median
from ddptop.tui.widgets.chart import EVENT_MARKS, Chart, Drawing, line_of, ms_label
from ddptop.tui.widgets.rank_heatmap import RankHeatmap, own_matrix
from ddptop.tui.widgets.time_axis import Window, window

LINES_UP_TO = 8
"""More ranks than this are drawn as a heatmap: nine lines are already a tangle."""
PRIORITY = ("throughput", "loss", "ranks", "step time", "memory")
"""What one row of charts shows first, as the terminal narrows."""
CHART_WIDTH = 40
"""Columns a chart needs to be read."""

OWN_WORK_MARKS = EVENT_MARKS | {"compute"}
"""The ranks' chart also marks where own work starts to count compute: the lines step up there
by each rank's compute, which is no slowdown."""


def _with_unit(metric: Metric) -> Callable[[float, float], str]:
    """An axis label: bytes in the unit of the axis's largest (format.nbytes names its own), other
    metrics in theirs."""
    if metric.unit == "bytes":
        return nbytes
    unit = "" if metric.unit in ("", "ratio", "percent") else f" {metric.unit}"
    return lambda value, _: f"{metric.text(value)}{unit}"


def job_drawing(title: str, metrics: list[Metric], win: Window) -> Drawing:
    drawn = (line_of(metric.key.replace("_", " "), win, (p.job.get(metric.key) for p in win.points)) for metric in metrics)
    lines = [line for line in drawn if line.xs]  # a metric never measured is no line, and no legend entry
    return Drawing(title, lines, win, _with_unit(metrics[0]), missing=f"no {title} reported yet")


def rank_drawing(win: Window, ranks: int, data_alone: bool = False, groups: list[list[int]] | None = None) -> Drawing:
    """One line per rank of its own work; the slowest now against its group's median is named
    (groups: lag.peer_groups), and that it is the data wait alone while it is (lag.counts_compute)."""
    own = own_matrix(win.points, ranks)
    lines = [line_of(f"rank {r}", win, own[:, r].tolist()) for r in range(ranks)]
    notes = []  # the most telling first: the title keeps those that fit (PlotArea.set_title)
    last = own[-1].tolist() if len(own) else []
    ratios: list[tuple[int, float]] = []
    for members in groups or [list(range(ranks))]:
        finite = [(r, last[r]) for r in members if r < len(last) and math.isfinite(last[r])]
        typical = (median([v for _, v in finite]) or 0.0) if len(finite) > 1 else 0.0  # the straggler rule's median
        ratios += [(r, v / typical) for r, v in finite] if typical else []
    if ratios:
        rank, ratio = max(ratios, key=lambda item: item[1])
        notes.append(f"slowest now: rank {rank} at {ratio:.2f}x")
    if data_alone:
        notes.append(DATA_ALONE)
    return Drawing(
        "own work per rank (data wait + compute)",
        lines,
        win,
        ms_label,
        missing="no per-rank step times yet",
        legend=ranks <= 4,
        notes=notes,
        marks=OWN_WORK_MARKS,
    )


def many_ranks(state: JobState) -> bool:
    """Ranks drawn as a heatmap rather than a line each."""
    return len(state.ranks) > LINES_UP_TO


class Charts(Vertical):
    GROUPS = grouped(lambda metric: metric.plot)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.caption = Static(id="charts-caption")
        self.grid = Grid(id="charts-grid")
        self.job_charts = {title: Chart(id=f"chart-{title.replace(' ', '-')}", classes="chart") for title, _ in self.GROUPS}
        self.rank_lines = Chart(id="chart-ranks", classes="chart ranks")
        self.heatmap = RankHeatmap(id="heatmap", classes="chart ranks")
        self.whole = False

    def compose(self) -> ComposeResult:
        yield self.caption
        with self.grid:
            yield from self.job_charts.values()
            yield self.rank_lines
            yield self.heatmap

    def _by_name(self, name: str) -> list[Chart | RankHeatmap]:
        return [self.rank_lines, self.heatmap] if name == "ranks" else [self.job_charts[name]]

    def place(self, rows: int, width: int, many_ranks: bool) -> None:
        """Two rows of charts (rows=2), one row of the PRIORITY charts that fit the width, or none."""
        self.display = rows > 0
        if rows == 0:
            return
        names = list(PRIORITY) if rows == 2 else list(PRIORITY[: max(1, min(len(PRIORITY), width // CHART_WIDTH))])
        columns = 3 if rows == 2 else len(names)
        self.grid.styles.grid_size_columns = columns
        self.grid.styles.grid_size_rows = rows
        for name in PRIORITY:
            for chart in self._by_name(name):
                chart.display = name in names and (name != "ranks" or (chart is self.heatmap) == many_ranks)
        for chart in (self.rank_lines, self.heatmap):
            chart.styles.column_span = 2 if rows == 2 else 1

    @property
    def count(self) -> int:
        """Charts that `show` draws in turn: the job's, then the ranks'."""
        return len(self.GROUPS) + 1

    def show(self, state: JobState, now: float, which: int | None = None) -> None:
        """Redraw chart number `which` (in turn, so that no frame draws them all: at 1,024
        ranks that held a keypress for a tenth of a second), or every chart when None."""
        win = window(state.history, self.whole, state.started, now)
        kinds = {mark.kind for mark in win.marks}
        marks = " [red]│[/] alert [yellow]│[/] restart" if kinds & EVENT_MARKS else ""
        marks += " [cyan]│[/] own work counts compute from here" if "compute" in kinds else ""
        other = "the last 10 min" if self.whole else "the whole run"
        self.caption.update(f"[b]charts: {win.name}[/b]  [dim](w: {other})[/dim]{marks}")
        for index, (title, metrics) in enumerate(self.GROUPS):
            if which in (None, index):
                self.job_charts[title].draw(job_drawing(title, metrics, win))
        if which in (None, len(self.GROUPS)):
            ranks = max(state.ranks, default=-1) + 1  # rank numbers index the history's arrays
            data_alone = not counts_compute(r for r in state.ranks.values() if r.window.points)
            groups = peer_groups(state.ranks.values())
            if many_ranks(state):
                self.heatmap.draw(win, ranks, data_alone, groups)
            else:
                self.rank_lines.draw(rank_drawing(win, ranks, data_alone, groups))
