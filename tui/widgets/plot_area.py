"""The room a plot takes on screen, its title, and what it shows when plotext cannot draw it."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot


def title_room(width: int, label_width: int) -> int:
    """The longest title plotext draws over a plot `width` columns wide whose y-axis labels are
    `label_width` wide. It centres the title on the canvas (the plot less its labels and an
    axis line either side), and drops a title that would cross the plot's right edge."""
    canvas = width - label_width - 2
    centre = label_width + 1 + canvas // 2
    return 2 * (width - centre)


def fitted_title(heading: str, notes: Iterable[str], room: int) -> str:
    """The heading, then each note that fits whole in the room: a note cut short could
    mislead ("slowest now: rank 1" without its ratio), and a title too long for plotext is
    not drawn at all, which would take the chart's name with it. A heading that does not fit
    alone is cut short, with an ellipsis."""
    if len(heading) > room:
        return heading[: room - 1] + "…" if room > 1 else ""
    title = heading
    for note in notes:
        if len(title) + 2 + len(note) <= room:
            title += f"  {note}"
    return title


class PlotArea(PlotextPlot):
    """What the charts and the heatmap share: their room, their title, and a plot plotext cannot draw."""

    DEFAULT_CSS = """
    PlotArea {
        height: 1fr;
        width: 1fr;
    }
    """

    def set_title(self, heading: str, notes: Iterable[str], label_width: int) -> None:
        """Give the plot the title that fits it now (fitted_title), its y-axis labels taking label_width columns."""
        self.plt.title(fitted_title(heading, notes, title_room(self.size.width, label_width)))

    def build(self, title: str) -> RenderResult:
        """The plot set up on self.plt, at the widget's size now."""
        try:
            return super().render()
        except (IndexError, ValueError, ZeroDivisionError):
            # plotext's own limits (a size too small for its legend and labels): a chart
            # that cannot be drawn says so, and the dashboard goes on.
            return Text.from_markup(f"[b]{title}[/b]\n[dim]too small to draw here[/dim]")
