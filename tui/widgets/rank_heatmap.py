"""Ranks by time, each cell coloured by the rank's own work against the job's median then
(its group's, where ranks are data-parallel with part of the job: lag.peer_groups).

In DDP every rank's step takes as long as the slowest one's (the others
wait for it in the all-reduce), so what sets a straggler apart is its own
work, its data wait and compute (model/lag.py); a rank whose own work stays over the
median is a stripe across the map, at 64 ranks as at 1,024. When ranks
outnumber rows, a row stands for several and shows the slowest of them,
so a straggler is never averaged away.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual.app import RenderResult

from ddptop.core.model.history import Point
from ddptop.core.model.lag import DATA_ALONE
from ddptop.tui.widgets.plot_area import PlotArea
from ddptop.tui.widgets.time_axis import Window, time_ticks

NO_STEP = (60, 60, 60)
FRAME_ROWS = 4
"""Rows plotext takes around a matrix: the title, the top border, the x axis and its labels."""
FRAME_COLUMNS = 3
"""Columns beside the y labels: the tick mark and the two borders."""
STOPS = ((0.0, (40, 80, 120)), (1.0, (40, 110, 70)), (1.25, (220, 190, 40)), (2.0, (220, 50, 40)))
"""Ratio to the median -> colour: at or under it cool, a quarter over it yellow, twice it red."""


def colour(ratio: float) -> tuple[int, int, int]:
    if math.isnan(ratio):
        return NO_STEP
    for (low, a), (high, b) in itertools.pairwise(STOPS):
        if ratio <= high:
            t = max(0.0, (ratio - low) / (high - low))
            return (round(a[0] + t * (b[0] - a[0])), round(a[1] + t * (b[1] - a[1])), round(a[2] + t * (b[2] - a[2])))
    return STOPS[-1][1]


@dataclass(frozen=True)
class Heat:
    """The map, exactly rows x columns cells (plotext leaves gaps otherwise): ratios by row, top
    first; the ranks each row stands for; each column's wall; the slowest rank in the newest column."""

    rows: list[list[float]]
    row_ranks: list[range]
    walls: list[float]
    worst: tuple[int, float] | None


def _spread(total: int, parts: int) -> list[range]:
    """total items over parts slots in order: a slot takes several items, or an item several slots."""
    return [range(i * total // parts, max(i * total // parts + 1, (i + 1) * total // parts)) for i in range(parts)]


def own_matrix(points: list[Point], ranks: int) -> np.ndarray:
    """points x ranks of own work, NaN where none: as the summary carries it, or for a run logged
    before it did, step less comm (step alone where comm is missing)."""
    matrix = np.full((len(points), ranks), np.nan, dtype=np.float32)
    for i, point in enumerate(points):
        own = point.ranks.get("own_ms")
        if own is not None:
            row = np.frombuffer(own, dtype=np.float32)[:ranks]
            matrix[i, : len(row)] = row
            continue
        steps, comms = point.ranks.get("step_ms"), point.ranks.get("comm_ms")
        if steps is None:
            continue
        row = np.frombuffer(steps, dtype=np.float32)[:ranks]
        if comms is not None:
            comm = np.frombuffer(comms, dtype=np.float32)[: len(row)]
            comm = np.pad(comm, (0, len(row) - len(comm)), constant_values=np.nan)
            row = np.where(np.isnan(comm), row, row - comm)
        matrix[i, : len(row)] = row
    return matrix


def typical(own: np.ndarray, groups: list[list[int]] | None) -> np.ndarray:
    """Each cell's median to be set against: its point's over every rank, or over its rank's
    group. The nearest-rank median, as the straggler rule takes it (lag.py): of two ranks the
    faster, so that a straggler among two reads as the rule reads it, not against their mean."""
    middle = np.full_like(own, np.nan)
    for members in groups or [list(range(own.shape[1]))]:
        columns = [rank for rank in members if rank < own.shape[1]]
        if columns:
            middle[:, columns] = np.nanpercentile(own[:, columns], 50, axis=1, keepdims=True, method="inverted_cdf")
    return middle


def heat(points: list[Point], ranks: int, rows: int, columns: int, groups: list[list[int]] | None = None) -> Heat:
    """A column shows the newest point of its stretch of time (a cell cannot show more); a row
    the slowest of its ranks. In numpy: at 1,024 ranks a redraw in Python took over 100 ms,
    long enough to delay a keypress. groups: the ranks set against one another (lag.peer_groups)."""
    if not points or ranks <= 0 or rows <= 0 or columns <= 0:
        return Heat([], [], [], None)
    indices = [stretch[-1] for stretch in _spread(len(points), columns)]
    unique = sorted(set(indices))
    own = own_matrix([points[i] for i in unique], ranks)  # each point once, however many columns show it
    picked = [points[i] for i in indices]
    with warnings.catch_warnings():  # a column of no steps at all is NaN, as it should be
        warnings.simplefilter("ignore", RuntimeWarning)
        middle = typical(own, groups)
        ratios = np.where(middle > 0, own / middle, np.nan)
        row_ranks = _spread(ranks, rows)
        grid = np.stack([np.nanmax(ratios[:, members.start : members.stop], axis=1) for members in row_ranks])
    position = {index: n for n, index in enumerate(unique)}
    grid = grid[:, [position[i] for i in indices]]
    newest = ratios[-1]
    worst = None if np.all(np.isnan(newest)) else (int(np.nanargmax(newest)), float(np.nanmax(newest)))
    return Heat(grid.tolist(), row_ranks, [p.wall for p in picked], worst)


class RankHeatmap(PlotArea):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.window: Window | None = None
        self.ranks = 0
        self.data_alone = False
        self.groups: list[list[int]] | None = None

    def draw(self, window: Window, ranks: int, data_alone: bool = False, groups: list[list[int]] | None = None) -> None:
        self.window, self.ranks, self.data_alone, self.groups = window, ranks, data_alone, groups
        self.refresh()

    def render(self) -> RenderResult:
        title = "own work per rank / median (data wait + compute)"
        window = self.window
        label_width = len(f"r{max(0, self.ranks - 1)}")
        rows, columns = self.size.height - FRAME_ROWS, self.size.width - label_width - FRAME_COLUMNS
        found = heat(window.points, self.ranks, rows, columns, self.groups) if window is not None else Heat([], [], [], None)
        if window is None or not found.walls:
            return Text.from_markup(f"[b]{title}[/b]\n[dim]no per-rank step times yet[/dim]")
        plt = self.plt
        plt.clear_figure()
        plt.matrix_plot([[colour(r) for r in row] for row in found.rows])
        labelled = _spread(rows, max(2, min(rows, rows // 3)))
        at = sorted({stretch[0] for stretch in labelled} | {rows - 1})
        plt.yticks([rows - 1 - i for i in at], [f"r{found.row_ranks[i][0]}" for i in at])
        first, last = window.x(found.walls[0]), window.x(found.walls[-1])
        ticks, names = time_ticks(first, last, max(2, min(5, self.size.width // 14)))
        span = (last - first) or 1.0
        plt.xticks([(t - first) / span * (columns - 1) for t in ticks], names)
        plt.xlabel("")
        plt.ylabel("")
        per_row = math.ceil(self.ranks / rows)
        notes = [f"slowest now: rank {found.worst[0]} at {found.worst[1]:.2f}x"] if found.worst else []
        if per_row > 1:
            notes.append(f"a row is up to {per_row} ranks (the slowest)")
        if self.data_alone:
            notes.append(DATA_ALONE)
        self.set_title(title, notes, label_width)
        return self.build(title)
