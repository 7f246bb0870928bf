"""The node rollup: one line per node, its worst rank named, for jobs too big to list.

A thousand ranks do not fit a screen, and a sea of healthy rows hides the
one that is not. This table folds each node's ranks into one line (ranks
alive, step range, total samples/s, the slowest rank's step time, the
highest comm share, alerts) and names the node's worst rank and why, in
the order a person would look: gone, silent, alerting or sending bad data,
straggling, slowest. Enter on a node drills down to its ranks (the app).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.segment import Segment
from rich.style import Style

from ddptop.core.format import count, counted, ms
from ddptop.core.model.job import JobState
from ddptop.core.model.lag import HIGHLIGHT_RATIO, HIGHLIGHT_SHARE, Lag
from ddptop.core.model.metrics import COMM_SHARE, SAMPLES_PER_S, STEP_MS_P50
from ddptop.core.model.rank import RankState
from ddptop.tui.widgets.line_table import LineTable
from ddptop.tui.widgets.rank_table import rank_status

HEADER = ["NODE", "HOST", "RANKS", "WORST RANK", "STEP", "SAMPLES/S", "SLOWEST STEP MS", "MAX COMM %", "ALERTS"]
"""The worst rank right after the node: what the rollup is for, in view on an 80-column terminal."""


@dataclass
class Worst:
    """A node's worst rank: how bad (higher is worse), which, and why in words."""

    badness: float
    rank: int
    why: str
    mark: str


def worst_rank(ranks: list[RankState], lags: dict[int, Lag], now: float, live: bool, finished: bool = False) -> Worst:
    """finished: the job ended with exit 0, so every rank has exited as it should: none is worst for that."""

    def judge(rank: RankState) -> Worst:
        status = rank_status(rank, now, live)
        if rank.exited and not finished:
            return Worst(5, rank.rank, "exited", "alerting")
        if status.startswith("silent"):
            return Worst(4, rank.rank, "silent", "alerting")
        if rank.alerts or rank.data_problems:
            problems = counted(rank.alerts, "alert") if rank.alerts else f"bad data {rank.data_problems}"
            return Worst(3, rank.rank, problems, "alerting")
        lag = lags.get(rank.rank)
        if lag is not None and lag.over(HIGHLIGHT_RATIO, HIGHLIGHT_SHARE):
            return Worst(2 + min(lag.ratio, 100) / 1000, rank.rank, f"straggler {lag.ratio:.1f}x", "straggler")
        p50 = STEP_MS_P50.read(rank)
        return Worst(1 + (p50 or 0.0) / 1e9, rank.rank, f"step {ms(p50)} ms", "")

    return max((judge(r) for r in ranks), key=lambda w: (w.badness, -w.rank))


class NodeTable(LineTable):
    PREFIX = "node-table"
    DEFAULT_CSS = """
    NodeTable > .node-table--header { text-style: bold; background: $panel; }
    NodeTable > .node-table--cursor { background: $accent 40%; text-style: bold; }
    NodeTable > .node-table--zebra { background: $boost; }
    NodeTable > .node-table--straggler { color: $warning; text-style: bold; }
    NodeTable > .node-table--alerting { color: $error; text-style: bold; }
    """
    COMPONENT_CLASSES = {"node-table--header", "node-table--cursor", "node-table--zebra", "node-table--straggler", "node-table--alerting"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(HEADER, **kwargs)
        self._rows: dict[int, list[str]] = {}
        self._marks: dict[int, str] = {}

    def selected_node(self) -> int | None:
        return self._cursor if self._cursor in self._rows else None

    def cell(self, node: int, column: str) -> str:
        return self._rows[node][HEADER.index(column)]

    def mark(self, node: int) -> str:
        return self._marks[node]

    def show(self, state: JobState, now: float, live: bool) -> None:
        by_node: dict[int, list[RankState]] = {}
        for rank in state.ranks.values():
            by_node.setdefault(rank.node, []).append(rank)
        lags = state.lags()
        finished = state.exit is not None and state.exit.get("code") == 0
        rows, marks = {}, {}
        for node, ranks in by_node.items():
            worst = worst_rank(ranks, lags, now, live, finished)
            steps = [r.step for r in ranks if r.step >= 0]
            rate = state.figure(SAMPLES_PER_S, ranks)
            p50s = [x for r in ranks if (x := STEP_MS_P50.read(r)) is not None]
            shares = [x for r in ranks if (x := COMM_SHARE.read(r)) is not None]
            rows[node] = [
                str(node),
                ranks[0].host or "-",
                f"{sum(not r.exited for r in ranks)}/{len(ranks)}",
                f"rank {worst.rank}: {worst.why}",
                "-" if not steps else str(min(steps)) if min(steps) == max(steps) else f"{min(steps)}-{max(steps)}",
                "-" if rate is None else count(rate),
                ms(max(p50s)) if p50s else "-",
                f"{max(shares):.0%}" if shares else "-",
                str(sum(r.alerts for r in ranks)),
            ]
            marks[node] = worst.mark
            self._widen(rows[node])
        order = sorted(rows)
        if rows == self._rows and marks == self._marks and order == self._order:
            return
        self._rows, self._marks = rows, marks
        self._set_order(order)

    def _row_texts(self, key: int) -> list[str]:
        return self._rows[key]

    def _row_segments(self, key: int, line: str, base: Style) -> list[Segment]:
        """The whole line takes the worst rank's colour."""
        mark = self._marks[key]
        return [Segment(line, base + self._style(mark) if mark else base)]
