"""The rank table: one line per rank, drawn with Textual's line API.

DataTable re-renders every visible cell whenever any cell changes (its
render caches are keyed by a global update count), which at 64 ranks
updating ten times a second saturates a core. This table keeps each rank's
cell texts, and draws a line as a string join and a Strip, so a refresh
costs microseconds a visible line. The cursor follows its rank, not its
position, through re-sorts and filtering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ddptop.supervisor.jobstate import STRAGGLER_RATIO, JobState, RankState
from ddptop.supervisor.summary import count, ms, nbytes

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


GAP = "  "


class RankTable(ScrollView, can_focus=True):
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
    BINDINGS = [
        Binding("up", "cursor(-1)", show=False),
        Binding("down", "cursor(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "cursor(-1000000)", show=False),
        Binding("end", "cursor(1000000)", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sort_key = "rank"
        self.sort_reverse = False
        self.filter_text = ""
        self.only_node: int | None = None
        """A node drilled into from the node rollup: only its ranks are shown."""
        self._cells: dict[int, list[str]] = {}
        self._marks: dict[int, str] = {}
        self._order: list[int] = []
        self._widths = [len(label) for _, label, *_ in COLUMNS]
        self._cursor_rank: int | None = None
        self._styles: dict[str, Style] = {}

    def notify_style_update(self) -> None:
        """CSS or theme changed: the cached component styles are stale."""
        super().notify_style_update()
        self._styles = {}

    def _style(self, name: str) -> Style:
        """A component style ("base" is the widget's own), resolved once per CSS change."""
        if name not in self._styles:
            self._styles[name] = self.rich_style if name == "base" else self.get_component_rich_style(f"rank-table--{name}")
        return self._styles[name]

    @property
    def row_count(self) -> int:
        return len(self._order)

    def ranks_in_order(self) -> list[int]:
        return list(self._order)

    def cell(self, rank: int, key: str) -> str:
        return self._cells[rank][_INDEX[key]]

    def mark(self, rank: int) -> str:
        """"alerting", "straggler" or "" for a shown rank."""
        return self._marks[rank]

    def selected_rank(self) -> int | None:
        return self._cursor_rank if self._cursor_rank in self._cells else None

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
            self._widths = [max(w, len(text)) for w, text in zip(self._widths, row)]
        order = sorted(sort_values, key=lambda r: (sort_values[r], r), reverse=self.sort_reverse)
        if cells == self._cells and marks == self._marks and order == self._order:
            return
        self._cells, self._marks, self._order = cells, marks, order
        if self._cursor_rank not in cells:
            self._cursor_rank = order[0] if order else None
        size = Size(sum(self._widths) + len(GAP) * (len(self._widths) - 1) + 2, len(order) + 1)
        if size != self.virtual_size:  # a new virtual size costs a layout pass
            self.virtual_size = size
        self.refresh()

    def _matches(self, rank: RankState, now: float, live: bool) -> bool:
        if self.only_node is not None and rank.node != self.only_node:
            return False
        if not self.filter_text:
            return True
        words = f"node {rank.node} rank {rank.rank} {rank.host} {rank_status(rank, now, live)}".lower()
        return all(part in words for part in self.filter_text.lower().split())

    def _line(self, texts: list[str]) -> str:
        return " " + GAP.join(t.ljust(w) for t, w in zip(texts, self._widths)) + " "

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            style = self._style("header")
            segments = [Segment(self._line([label for _, label, *_ in COLUMNS]), style)]
        else:
            index = scroll_y + y - 1
            if index >= len(self._order):
                return Strip.blank(width, self._style("base"))
            segments = self._row_segments(index)
        return Strip(segments).crop(scroll_x, scroll_x + width).adjust_cell_length(width, self._style("base"))

    def _row_segments(self, index: int) -> list[Segment]:
        """A row as few segments as its styles allow: Textual's per-line work
        (filters, cropping) grows with segments, not with characters."""
        rank = self._order[index]
        base = self._style("base")
        if rank == self._cursor_rank and self.has_focus:
            base += self._style("cursor")
        elif index % 2:
            base += self._style("zebra")
        line = self._line(self._cells[rank])
        mark = self._marks[rank]
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

    def _move_to(self, index: int) -> None:
        if not self._order:
            return
        index = max(0, min(len(self._order) - 1, index))
        self._cursor_rank = self._order[index]
        self.scroll_to_region(Region(0, index + 1, 1, 1), animate=False, spacing=None)
        self.refresh()

    def action_cursor(self, delta: int) -> None:
        current = self._order.index(self._cursor_rank) if self._cursor_rank in self._order else 0
        self._move_to(current + delta)

    def action_page(self, direction: int) -> None:
        self.action_cursor(direction * max(1, self.size.height - 2))

    def on_click(self, event: events.Click) -> None:
        if event.y > 0:
            self._move_to(self.scroll_offset.y + event.y - 1)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def cycle_sort(self) -> str:
        self.sort_key = SORTABLE[(SORTABLE.index(self.sort_key) + 1) % len(SORTABLE)]
        return self.sort_key

    def reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
