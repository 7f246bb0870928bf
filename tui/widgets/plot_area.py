"""The room a plot takes on screen, and what it shows when plotext cannot draw it."""

from __future__ import annotations

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot


class PlotArea(PlotextPlot):
    """What the charts and the heatmap share: their room, and a plot plotext cannot draw."""

    DEFAULT_CSS = """
    PlotArea {
        height: 1fr;
        width: 1fr;
    }
    """

    def build(self, title: str) -> RenderResult:
        """The plot set up on self.plt, at the widget's size now."""
        try:
            return super().render()
        except (IndexError, ValueError, ZeroDivisionError):
            # plotext's own limits (a size too small for its legend and labels): a chart
            # that cannot be drawn says so, and the dashboard goes on.
            return Text.from_markup(f"[b]{title}[/b]\n[dim]too small to draw here[/dim]")
