"""The rank table: one line per rank (the drawing is line_table.py's).

Each rank's cell texts are kept, so a refresh costs microseconds a visible
line; rows are sorted and filtered here, and ranks with alerts or that
straggle get their rank and state columns coloured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.segment import Segment
from rich.style import Style

from ddptop.core.format import count, ms, nbytes
from ddptop.core.model.job import STRAGGLER_RATIO, JobState, RankState
from ddptop.tui.widgets.line_table import GAP, LineTable

SILENT_S = 5.0
"""A live rank not heard from for this long is shown as silent."""


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _gpu_memory(state: JobState, rank: RankState) -> str:
    gpu = state.gpus.get(rank.gpu) if rank.gpu is not None else None
    used = rank.gpu_mem if rank.gpu_mem is not None else rank.mem_reserved
    if gpu is None or not gpu.mem_total or used is None:
        return "-" if used is None else nbytes(used)
    filled = round(8 * used / gpu.mem_total)
    peak = nbytes(rank.mem_peak) if rank.mem_peak is not None else "-"
    return f"{'█' * filled}{'░' * (8 - filled)} {nbytes(used)} pk {peak}/{nbytes(gpu.mem_total)}"


def rank_status(rank: RankState, now: float, live: bool) -> str:
    if rank.exited:
        status = "exited"
    elif live and rank.last_wall and now - rank.last_wall > SILENT_S:
        status = "silent"
    else:
        status = rank.phase
    return f"{status} bad data {rank.data_problems}" if rank.data_problems else status


Column = tuple[str, str, Callable[[JobState, RankState, float, bool], str], Callable[[JobState, RankState], Any]]

COLUMNS: list[Column] = [
    ("node", "NODE", lambda s, r, n, l: str(r.node), lambda s, r: (r.node, r.rank)),
    ("rank", "RANK", lambda s, r, n, l: str(r.rank), lambda s, r: r.rank),
    ("pid", "PID", lambda s, r, n, l: str(r.pid or "-"), lambda s, r: r.pid),
    ("state", "STATE", lambda s, r, n, l: rank_status(r, n, l), lambda s, r: r.phase),
    ("step", "STEP", lambda s, r, n, l: "-" if r.step < 0 else str(r.step), lambda s, r: r.step),
    ("sps", "SAMPLES/S", lambda s, r, n, l: count(r.samples_per_s()), lambda s, r: r.samples_per_s() or 0.0),
    ("step_ms", "STEP MS p50/95", lambda s, r, n, l: f"{ms(r.window.step_ms(50))}/{ms(r.window.step_ms(95))}", lambda s, r: r.window.step_ms(50) or 0.0),
    ("comm", "COMM MS", lambda s, r, n, l: ms(r.window.mean("comm_ms")), lambda s, r: r.window.mean("comm_ms") or 0.0),
    ("comm_pct", "COMM %", lambda s, r, n, l: _num(r.comm_share(), "{:.0%}"), lambda s, r: r.comm_share() or 0.0),
    ("data", "DATA MS", lambda s, r, n, l: ms(r.window.mean("data_ms")), lambda s, r: r.window.mean("data_ms") or 0.0),
    ("loss", "LOSS", lambda s, r, n, l: _num(r.loss, "{:.4g}"), lambda s, r: r.loss if r.loss is not None else float("inf")),
    ("gnorm", "GRAD NORM", lambda s, r, n, l: _num(r.grad_norm, "{:.3g}"), lambda s, r: r.grad_norm or 0.0),
    ("gpu", "GPU %", lambda s, r, n, l: _num(s.gpus[r.gpu].util if r.gpu in s.gpus else None, "{:.0f}"), lambda s, r: s.gpus[r.gpu].util or 0.0 if r.gpu in s.gpus else 0.0),
    ("gmem", "GPU MEM used pk/total", lambda s, r, n, l: _gpu_memory(s, r), lambda s, r: r.gpu_mem or r.mem_reserved or 0),
    ("cpu", "CPU %", lambda s, r, n, l: _num(r.cpu_percent, "{:.0f}"), lambda s, r: r.cpu_percent or 0.0),
    ("rss", "RSS", lambda s, r, n, l: nbytes(r.rss), lambda s, r: r.rss or 0),
]
SORTABLE = [key for key, *_ in COLUMNS if key not in ("pid", "state")]
HIGHLIGHTED = ("rank", "state")
_KEYS = [key for key, *_ in COLUMNS]
_INDEX = {key: i for i, key in enumerate(_KEYS)}
_SORT = {key: sort_of for key, _, _, sort_of in COLUMNS}



class RankTable(LineTable):
    PREFIX = "rank-table"
    DEFAULT_CSS = """
    RankTable > .rank-table--header { text-style: bold; background: $panel; }
    RankTable > .rank-table--cursor { background: $accent 40%; text-style: bold; }
    RankTable > .rank-table--zebra { background: $boost; }
    RankTable > .rank-table--straggler { color: $warning; text-style: bold; }
    RankTable > .rank-table--alerting { color: $error; text-style: bold; }
    """
    COMPONENT_CLASSES = {
        "rank-table--header", "rank-table--cursor", "rank-table--zebra",
        "rank-table--straggler", "rank-table--alerting",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__([label for _, label, *_ in COLUMNS], **kwargs)
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
        """"alerting", "straggler" or "" for a shown rank."""
        return self._marks[rank]

    def selected_rank(self) -> int | None:
        return self._cursor if self._cursor in self._cells else None

    def show(self, state: JobState, now: float, live: bool) -> None:
        ratios = state.straggler_ratios()
        shown = [r for r in state.ranks.values() if self._matches(r, now, live)]
        cells: dict[int, list[str]] = {}
        marks: dict[int, str] = {}
        sort_values: dict[int, Any] = {}
        sort_of = _SORT[self.sort_key]
        for rank in shown:
            row = [render(state, rank, now, live) for _, _, render, _ in COLUMNS]
            cells[rank.rank] = row
            ratio = ratios.get(rank.rank)
            marks[rank.rank] = "alerting" if rank.alerts or rank.data_problems else "straggler" if ratio and ratio > STRAGGLER_RATIO else ""
            sort_values[rank.rank] = sort_of(state, rank)
            self._widen(row)
        order = sorted(sort_values, key=lambda r: (sort_values[r], r), reverse=self.sort_reverse)
        if cells == self._cells and marks == self._marks and order == self._order:
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
        spans, at = [], 1
        for key, width in zip(_KEYS, self._widths):
            if key in HIGHLIGHTED:
                spans.append((at, at + width))
            at += width + len(GAP)
        return spans

    def cycle_sort(self) -> str:
        self.sort_key = SORTABLE[(SORTABLE.index(self.sort_key) + 1) % len(SORTABLE)]
        return self.sort_key

    def reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
