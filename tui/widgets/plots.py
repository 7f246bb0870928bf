"""Plots over time, drawn with Textual's own Sparkline.

Job-wide series come from the supervisor's per-second "summary" records, so
a live dashboard and a replay plot the same points. Redrawn once a second,
not per frame: the sparklines change slowly and redraws are not free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from textual.app import ComposeResult
from textual.containers import Grid, Vertical
from textual.widgets import Label, Sparkline

from ddptop.core import wire
from ddptop.core.format import count, ms
from ddptop.core.model.metrics import Metric, grouped


def _series(summaries: list[wire.Frame], metrics: list[Metric]) -> tuple[Metric, list[float]]:
    """The first of a plot's metrics that has values in the summaries, and its values."""
    for metric in metrics:
        values = [v for s in summaries if (v := s["metrics"].get(metric.key)) is not None]
        if values:
            return metric, values
    return metrics[0], []


def _with_unit(metric: Metric) -> Callable[[float | None], str]:
    unit = "" if metric.unit in ("", "bytes", "ratio", "percent") else f" {metric.unit}"
    return lambda value: f"{metric.text(value)}{unit}"


class Plot(Vertical):
    def __init__(self, key: str, title: str, fmt: Callable[[float | None], str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.key, self.title, self.fmt = key, title, fmt
        # Kept, not queried: a refresh may come before the children are mounted.
        self.label = Label(title, classes="plot-title")
        self.sparkline = Sparkline([], summary_function=max)

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.sparkline

    def show(self, points: list[float], latest: float | None) -> None:
        """Plot on a zero-based scale: a steady series shows as steady bars, not as nothing."""
        self.label.update(f"{self.title}: [b]{self.fmt(latest)}[/b]")
        self.sparkline.data = [0.0, *points] if points else []


class Plots(Grid):
    """One plot per plot title of the metric table, from the job's summary records."""

    GROUPS = grouped(lambda metric: metric.plot)

    def compose(self) -> ComposeResult:
        for title, metrics in self.GROUPS:
            yield Plot(title, title, _with_unit(metrics[0]), id=f"plot-{metrics[0].key}")

    def show(self, summaries: Iterable[wire.Frame]) -> None:
        summaries = list(summaries)
        for plot, (_, metrics) in zip(self.query(Plot), self.GROUPS):
            metric, values = _series(summaries, metrics)
            plot.fmt = _with_unit(metric)
            plot.show(values, values[-1] if values else None)


class RankPlots(Grid):
    """One rank's recent steps (its rolling window), for the detail screen."""

    def compose(self) -> ComposeResult:
        yield Plot("step_ms", "step time", lambda v: f"{ms(v)} ms", id="rplot-step")
        yield Plot("comm_ms", "comm latency", lambda v: f"{ms(v)} ms", id="rplot-comm")
        yield Plot("data_ms", "data wait", lambda v: f"{ms(v)} ms", id="rplot-data")
        yield Plot("samples", "samples/step", lambda v: count(v), id="rplot-samples")

    def show(self, points: list) -> None:
        for plot in self.query(Plot):
            values = [v for p in points if (v := getattr(p, plot.key)) is not None]
            plot.show(values, values[-1] if values else None)
