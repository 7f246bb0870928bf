"""A chart over the run's time: lines with axes in the metric's units, alerts and restarts marked.

Drawn with plotext through textual-plotext. A chart is told what to draw
(a Drawing) once a second at most, and builds the plot when Textual
renders it, at its size then, so a resize redraws at the new size without
waiting for data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rich.text import Text
from textual.app import RenderResult

from ddptop.core.format import ms
from ddptop.tui.widgets.plot_area import PlotArea
from ddptop.tui.widgets.time_axis import Window, gaps_apart, spans_decades, thin, time_ticks, value_axis

MARK_COLORS = {"alert": "red", "restart": "orange+", "compute": "cyan"}

EVENT_MARKS = frozenset({"alert", "restart"})
"""The marks every chart draws: what happened to the job. A chart draws others of its own."""
LINE_COLORS = ("cyan+", "magenta+", "green+", "orange+", "blue+", "red+", "white", "gray")
"""plotext's own colour names (its "orange" is the terminal's yellow); a name it does not know
is silently replaced, part by part, from its own sequence."""


@dataclass(frozen=True)
class Line:
    label: str
    xs: list[float]
    ys: list[float]


def line_of(label: str, win: Window, values: Iterable[float | None]) -> Line:
    """A line through the window's points, one value a point; a point with no value, or one
    that is not a number, is left out."""
    xs, ys = [], []
    for point, value in zip(win.points, values):
        if value is not None and math.isfinite(value):
            xs.append(win.x(point.wall))
            ys.append(value)
    return Line(label, xs, ys)


def ms_label(value: float, _like: float) -> str:
    """An axis label of a chart in milliseconds, which reads in one unit at any size."""
    return f"{ms(value)} ms"


@dataclass(frozen=True)
class Drawing:
    title: str
    lines: list[Line]
    window: Window
    text: Callable[[float, float], str]
    """A y value in the metric's units, for the axis labels, in the unit of the second value
    where the metric's unit varies (time_axis.value_axis)."""
    missing: str = "no data yet"
    """Said instead of a plot when no line has a point."""
    legend: bool = True
    notes: list[str] = field(default_factory=list)
    """Said after the title, the most telling first: those that do not fit whole are left out (PlotArea.set_title)."""
    marks: frozenset[str] = EVENT_MARKS
    """The kinds of the window's marks this chart draws."""


class Chart(PlotArea):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.drawing: Drawing | None = None

    def draw(self, drawing: Drawing) -> None:
        self.drawing = drawing
        self.refresh()

    def render(self) -> RenderResult:
        drawing = self.drawing
        if drawing is None or not any(line.xs for line in drawing.lines):
            title = drawing.title if drawing is not None else ""
            return Text.from_markup(f"[b]{title}[/b]\n[dim]{drawing.missing if drawing else 'waiting for data'}[/dim]")
        plt = self.plt
        plt.clear_figure()
        window = drawing.window
        most = max(8, 2 * (self.size.width - 8))
        values = [y for line in drawing.lines for y in line.ys]
        log = spans_decades(values)
        for index, line in enumerate(drawing.lines):
            xs, ys = thin(line.xs, line.ys, most)
            if log:
                xs, ys = [x for x, y in zip(xs, ys) if y > 0], [y for y in ys if y > 0]
            label = line.label if drawing.legend and len(drawing.lines) > 1 else None
            for part_xs, part_ys in gaps_apart(xs, ys):  # a line is not drawn across a restart
                plt.plot(part_xs, part_ys, label=label, color=LINE_COLORS[index % len(LINE_COLORS)], marker="braille")
                label = None
        low, high = window.x(window.first), window.x(window.last)
        for mark in window.marks:
            if mark.kind in drawing.marks:
                plt.vline(window.x(mark.wall), MARK_COLORS.get(mark.kind, "white"))
        plt.xlim(low, high)
        plt.xticks(*time_ticks(low, high, max(2, min(5, self.size.width // 14))))
        if log:
            plt.yscale("log")
        low_y, high_y, ticks, labels = value_axis(min(values), max(values), log, drawing.text)
        if not log:  # plotext misplaces a log axis given limits
            plt.ylim(low_y, high_y)
        plt.yticks(ticks, labels)
        self.set_title(f"{drawing.title}{' (log)' if log else ''}", drawing.notes, max(map(len, labels), default=0))
        return self.build(drawing.title)
