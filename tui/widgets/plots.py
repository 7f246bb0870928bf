"""Plots over time, drawn with Textual's own Sparkline.

Job-wide series come from the supervisor's per-second "summary" records, so
a live dashboard and a replay plot the same points. Redrawn once a second,
not per frame: the sparklines change slowly and redraws are not free.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.containers import Grid, Vertical
from textual.widgets import Label, Sparkline

from ddptop.core.format import count, ms, nbytes

SERIES = [
    ("samples_per_s", "throughput", lambda v: f"{count(v)} samples/s"),
    ("loss", "loss", lambda v: "-" if v is None else f"{v:.4g}"),
    ("comm_ms", "comm latency", lambda v: f"{ms(v)} ms"),
    ("memory", "memory", lambda v: nbytes(v)),
]


def _value(summary: dict, key: str) -> float | None:
    if key == "memory":
        return summary.get("gpu_mem") if summary.get("gpu_mem") is not None else summary.get("rss")
    return summary.get(key)


class Plot(Vertical):
    def __init__(self, key: str, title: str, fmt, **kwargs) -> None:  # type: ignore[no-untyped-def]
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
    def compose(self) -> ComposeResult:
        for key, title, fmt in SERIES:
            yield Plot(key, title, fmt, id=f"plot-{key}")

    def show(self, summaries: Iterable[dict]) -> None:
        summaries = list(summaries)
        for plot in self.query(Plot):
            values = [v for s in summaries if (v := _value(s, plot.key)) is not None]
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
