"""Every rank's last stack dump, those that read alike told once with their ranks.

Opened with D on a job watched from outside: its watcher reads every rank
with py-spy in non-blocking mode and the dumps arrive as stack records, so
the screen redraws as they come. 64 ranks waiting in one all-reduce are one
stack, and the rank elsewhere stands apart, as `ddptop stacks PID` prints them.
"""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from ddptop.core.model.job import JobState
from ddptop.core.stack_groups import grouped, ranks_span

REDRAW_S = 0.5


class StacksScreen(Screen[None]):
    BINDINGS = [Binding("escape,q", "app.pop_screen", "back")]

    def __init__(self, state: JobState) -> None:
        super().__init__()
        self.state = state
        self.asked = time.time()
        self._shown: dict[int, float] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="stacks-title")
        with VerticalScroll(id="stacks-scroll"):
            yield Static(id="stacks-text", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(REDRAW_S, self.redraw)
        self.query_one(VerticalScroll).focus()

    def redraw(self) -> None:
        """The dumps taken since the screen asked for them, grouped, once a rank's comes."""
        dumps = {r.rank: r.stack for r in self.state.ranks.values() if r.stack is not None and (r.stack_wall or 0.0) >= self.asked}
        walls = {rank: self.state.ranks[rank].stack_wall or 0.0 for rank in dumps}
        if walls == self._shown and self._shown:
            return
        self._shown = walls
        waiting = len(self.state.ranks) - len(dumps)
        when = time.strftime("%H:%M:%S", time.localtime(self.asked))
        self.query_one("#stacks-title", Static).update(
            f"[b]stacks of every rank[/b], asked at {when}, grouped where they read alike"
            + (f"  [dim]({waiting} to come)[/dim]" if waiting else "")
        )
        text = "\n\n".join(f"{ranks_span(ranks)}:\n{stack}" for ranks, stack in grouped(dict(sorted(dumps.items()))))
        self.query_one("#stacks-text", Static).update(text or "(reading every rank's stacks)")
