"""The rank table: one row per rank, updated in place.

Rows are keyed by rank, so the cursor and scroll survive updates; a cell is
written only when its text changed. Sorting reorders rows by a numeric key
per column, filtering removes and re-adds rows, never a clear().
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

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
        return "exited"
    if live and rank.last_wall and now - rank.last_wall > SILENT_S:
        return "silent"
    return rank.phase


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


class RankTable(DataTable):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.sort_key = "rank"
        self.sort_reverse = False
        self.filter_text = ""
        self._cells: dict[tuple[str, str], str] = {}
        self._order: list[str] = []

    def on_mount(self) -> None:
        for key, label, *_ in COLUMNS:
            self.add_column(label, key=key)

    def selected_rank(self) -> int | None:
        if not self.row_count:
            return None
        return int(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value or 0)

    def show(self, state: JobState, now: float, live: bool) -> None:
        wanted = [r for _, r in sorted(state.ranks.items()) if self._matches(state, r, now, live)]
        keys = {str(r.rank) for r in wanted}
        for row_key in [k for k in self._rows_present() if k not in keys]:
            self.remove_row(row_key)
            self._cells = {cell: v for cell, v in self._cells.items() if cell[0] != row_key}
        present = set(self._rows_present())
        for rank in wanted:
            self._show_rank(state, rank, now, live, str(rank.rank) in present)
        self._apply_order(state, wanted)

    def _rows_present(self) -> list[str]:
        return [str(key.value) for key in self.rows]

    def _matches(self, state: JobState, rank: RankState, now: float, live: bool) -> bool:
        if not self.filter_text:
            return True
        words = f"node {rank.node} rank {rank.rank} {rank.host} {rank_status(rank, now, live)}".lower()
        return all(part in words for part in self.filter_text.lower().split())

    def _show_rank(self, state: JobState, rank: RankState, now: float, live: bool, exists: bool) -> None:
        row_key = str(rank.rank)
        ratio = state.straggler_ratio(rank)
        style = "bold red" if rank.alerts else "bold yellow" if ratio and ratio > STRAGGLER_RATIO else ""
        values = []
        for key, _, render, _ in COLUMNS:
            text = render(state, rank, now, live)
            cell = Text(text, style=style) if key in HIGHLIGHTED and style else text
            values.append((key, text + "\0" + style if key in HIGHLIGHTED else text, cell))
        if not exists:
            self.add_row(*(cell for *_, cell in values), key=row_key)
            self._cells.update({(row_key, key): marker for key, marker, _ in values})
            return
        for key, marker, cell in values:
            if self._cells.get((row_key, key)) != marker:
                self._cells[(row_key, key)] = marker
                self.update_cell(row_key, key, cell)

    def _apply_order(self, state: JobState, ranks: list[RankState]) -> None:
        sort_of = next(fn for key, _, _, fn in COLUMNS if key == self.sort_key)
        values = {str(r.rank): sort_of(state, r) for r in ranks}
        order = sorted(values, key=lambda k: (values[k], int(k)), reverse=self.sort_reverse)
        if order != self._order:
            self._order = order
            position = {k: i for i, k in enumerate(order)}
            self.sort("rank", key=lambda cell: position[str(cell)])

    def cycle_sort(self) -> str:
        self.sort_key = SORTABLE[(SORTABLE.index(self.sort_key) + 1) % len(SORTABLE)]
        self._order = []
        return self.sort_key

    def reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._order = []
