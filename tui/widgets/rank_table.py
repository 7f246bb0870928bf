"""The rank table: one line per rank (the drawing is line_table.py's).

Each rank's cell texts are kept, so a refresh costs microseconds a visible
line; rows are sorted and filtered here, and ranks with alerts or that
straggle get their rank and state columns coloured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.segment import Segment
from rich.style import Style

from ddptop.core.model.job import JobState
from ddptop.core.model.lag import HIGHLIGHT_RATIO, HIGHLIGHT_SHARE
from ddptop.core.model.metrics import Jobs, Metric, grouped
from ddptop.core.model.rank import RankState
from ddptop.tui.widgets.line_table import LineTable

SILENT_S = 5.0
"""A live rank not heard from for this long is shown as silent."""


def rank_status(rank: RankState, now: float, live: bool) -> str:
    if rank.exited:
        status = "exited"
    elif live and rank.last_wall and now - rank.last_wall > SILENT_S:
        status = "silent"
    else:
        status = rank.phase
    return f"{status} bad data {rank.data_problems}" if rank.data_problems else status


@dataclass(frozen=True)
class Column:
    key: str
    """The sort key: the metric's key, or the identity field's name."""
    header: str
    render: Callable[[RankState, float, bool], str]
    sort_of: Callable[[RankState], Any]
    optional: bool = False
    """Left out until some rank has a value in it."""
    jobs: Jobs = "launched"
    """The jobs whose table has it (metrics.Jobs): a job watched from outside has no steps."""


def _metric_column(header: str, metrics: list[Metric]) -> Column:
    """One column of the metric table: its metrics' texts joined by "/", sorted by the first."""
    first = metrics[0]

    def sort_of(rank: RankState) -> tuple[bool, float]:
        value = first.read(rank)
        return value is None, value or 0.0

    optional = all(m.optional for m in metrics)
    return Column(first.key, header, lambda r, now, live: "/".join(m.format(r) for m in metrics), sort_of, optional, first.jobs)


IDENTITY = [
    Column("node", "NODE", lambda r, now, live: str(r.node), lambda r: (r.node, r.rank), jobs="all"),
    Column("rank", "RANK", lambda r, now, live: str(r.rank), lambda r: r.rank, jobs="all"),
    Column("pid", "PID", lambda r, now, live: str(r.pid or "-"), lambda r: r.pid, jobs="all"),
    Column("state", "STATE", lambda r, now, live: rank_status(r, now, live), lambda r: r.phase, jobs="all"),
    Column("step", "STEP", lambda r, now, live: "-" if r.step < 0 else str(r.step), lambda r: r.step),
]
WHERE = Column("where", "WHERE", lambda r, now, live: r.where or "-", lambda r: r.where or "", jobs="all")
"""Last, as top's COMMAND is: the one long text, which a narrow terminal cuts rather than the numbers."""
COLUMNS = IDENTITY + [_metric_column(header, metrics) for header, metrics in grouped(lambda metric: metric.column)] + [WHERE]
SORTABLE = [c.key for c in COLUMNS if c.key not in ("pid", "state")]
HIGHLIGHTED = ("rank", "state")
_KEYS = [c.key for c in COLUMNS]
_INDEX = {key: i for i, key in enumerate(_KEYS)}
_SORT = {c.key: c.sort_of for c in COLUMNS}
_HEADERS = {c.key: c.header for c in COLUMNS}
_NOT_SHOWN = {
    False: frozenset(i for i, c in enumerate(COLUMNS) if c.jobs == "outside"),
    True: frozenset(i for i, c in enumerate(COLUMNS) if c.jobs == "launched"),
}
"""The columns a job's table leaves out, by whether ddptop watches it from outside."""


class RankTable(LineTable):
    PREFIX = "rank-table"
    FROZEN = 2
    """NODE and RANK stay in view when the table scrolls sideways."""
    DEFAULT_CSS = """
    RankTable > .rank-table--header { text-style: bold; background: $panel; }
    RankTable > .rank-table--cursor { background: $accent 40%; text-style: bold; }
    RankTable > .rank-table--zebra { background: $boost; }
    RankTable > .rank-table--straggler { color: $warning; text-style: bold; }
    RankTable > .rank-table--alerting { color: $error; text-style: bold; }
    """
    COMPONENT_CLASSES = {
        "rank-table--header",
        "rank-table--cursor",
        "rank-table--zebra",
        "rank-table--straggler",
        "rank-table--alerting",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__([c.header for c in COLUMNS], frozenset(i for i, c in enumerate(COLUMNS) if c.optional), **kwargs)
        self.hide(_NOT_SHOWN[False])
        self.sort_key = "rank"
        self.sort_reverse = False
        self.filter_text = ""
        self.only_node: int | None = None
        """A node drilled into from the node rollup: only its ranks are shown."""
        self._cells: dict[int, list[str]] = {}
        self._marks: dict[int, str] = {}

    def ranks_in_order(self) -> list[int]:
        return list(self._order)

    def cell(self, rank: int, key: str) -> str:
        return self._cells[rank][_INDEX[key]]

    def mark(self, rank: int) -> str:
        """ "alerting", "straggler" or "" for a shown rank."""
        return self._marks[rank]

    def selected_rank(self) -> int | None:
        return self._cursor if self._cursor in self._cells else None

    def show(self, state: JobState, now: float, live: bool) -> None:
        columns_changed = self.hide(_NOT_SHOWN[state.outside])
        lags = state.lags()
        shown = [r for r in state.ranks.values() if self._matches(r, now, live)]
        cells: dict[int, list[str]] = {}
        marks: dict[int, str] = {}
        sort_values: dict[int, Any] = {}
        sort_of = _SORT[self.sort_key]
        for rank in shown:
            row = [c.render(rank, now, live) for c in COLUMNS]
            cells[rank.rank] = row
            lag = lags.get(rank.rank)
            straggling = lag is not None and lag.over(HIGHLIGHT_RATIO, HIGHLIGHT_SHARE)
            marks[rank.rank] = "alerting" if rank.alerts or rank.data_problems else "straggler" if straggling else ""
            sort_values[rank.rank] = sort_of(rank)
            self._widen(row)
        order = sorted(sort_values, key=lambda r: (sort_values[r], r), reverse=self.sort_reverse)
        if cells == self._cells and marks == self._marks and order == self._order and not columns_changed:
            return
        self._cells, self._marks = cells, marks
        self._set_order(order)

    def _matches(self, rank: RankState, now: float, live: bool) -> bool:
        if self.only_node is not None and rank.node != self.only_node:
            return False
        if not self.filter_text:
            return True
        words = f"node {rank.node} rank {rank.rank} {rank.host} {rank_status(rank, now, live)}".lower()
        return all(part in words for part in self.filter_text.lower().split())

    def _row_texts(self, key: int) -> list[str]:
        return self._cells[key]

    def _row_segments(self, key: int, line: str, base: Style) -> list[Segment]:
        """A row as few segments as its styles allow: Textual's per-line work
        (filters, cropping) grows with segments, not with characters."""
        mark = self._marks[key]
        if not mark:
            return [Segment(line, base)]
        marked = base + self._style(mark)
        segments, at = [], 0
        for start, end in self._highlight_spans():
            segments += [Segment(line[at:start], base), Segment(line[start:end], marked)]
            at = end
        return [*segments, Segment(line[at:], base)]

    def _highlight_spans(self) -> list[tuple[int, int]]:
        """Character spans of the highlighted columns in a line."""
        return [(start, start + width) for key, start, width in zip(_KEYS, self._starts(), self._widths) if width and key in HIGHLIGHTED]

    def cycle_sort(self, step: int = 1) -> str:
        """Sort by the shown column step places on (1: the next; -1: the one before), round the
        end; its header, to say so. A column left out (tokens/s of a job without tokens, a CPU
        job's GPU figures) is passed over: a sort by it would order by nothing on screen."""
        shown = [key for key in SORTABLE if self._widths[_INDEX[key]]]
        at = shown.index(self.sort_key) if self.sort_key in shown else 0
        self.sort_key = shown[(at + step) % len(shown)]
        return _HEADERS[self.sort_key]

    def reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
