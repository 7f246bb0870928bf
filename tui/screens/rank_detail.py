"""One rank up close: its recent steps, where its main thread is now, its last stack dump, its log tail."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from ddptop.core.model.job import JobState
from ddptop.core.places import is_script_line
from ddptop.core.rundir import rank_log_tail
from ddptop.tui.widgets.plots import RankPlots

LOG_LINES = 200
STACK_LINES = 12
"""The live stack's innermost frames shown; the outer ones are counted."""


def live_stack(lines: list[str], inside: str | None) -> Text:
    """The main thread's stack as the last heartbeat gave it, innermost last as Python prints
    tracebacks: the script's frames bold, the libraries' dim."""
    text = Text.from_markup("[b]main thread now[/b]" + (f", inside {inside}" if inside else "") + "\n")
    if not lines:
        text.append("no stack received yet", style="dim")
    if len(lines) > STACK_LINES:
        text.append(f"... {len(lines) - STACK_LINES} outer frames\n", style="dim")
    for line in lines[-STACK_LINES:]:
        text.append(f"{line}\n", style="bold" if is_script_line(line) else "dim")
    text.rstrip()
    return text


def log_tail(run_dir: Path | None, local_rank: int, restart: int, lines: int = LOG_LINES) -> list[str]:
    """The end of a rank's stdout and stderr as torchrun kept them in the run directory."""
    if run_dir is None:
        return ["(no run directory on this machine: logs stay with the supervisor)"]
    return rank_log_tail(run_dir, local_rank, restart, lines) or ["(nothing logged yet)"]


class RankDetailScreen(Screen[None]):
    BINDINGS = [Binding("escape,q", "app.pop_screen", "back"), Binding("l", "focus_log", "log")]

    def __init__(self, state: JobState, rank: int, run_dir: Path | None, focus_log: bool = False) -> None:
        super().__init__()
        self.state, self.rank, self.run_dir, self.start_on_log = state, rank, run_dir, focus_log

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        yield RankPlots(id="rank-plots")
        yield Static(id="live-stack")
        yield Static(id="stack")
        yield Log(id="log", highlight=False)
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_detail()
        self.set_interval(1.0, self.refresh_detail)
        if self.start_on_log:
            self.action_focus_log()

    def refresh_detail(self) -> None:
        rank = self.state.ranks.get(self.rank)
        if rank is None:
            return
        self.query_one("#detail-title", Static).update(
            f"[b]rank {rank.rank}[/b]  node {rank.node} ({rank.host})  local rank {rank.local_rank}  "
            f"pid {rank.pid}  restart {rank.restart}  step {rank.step}  phase {rank.phase}  dropped {rank.dropped}"
        )
        self.query_one(RankPlots).show(list(rank.window.points))
        self.query_one("#live-stack", Static).update(live_stack(rank.live_stack, rank.inside))
        dump = Text.from_markup("[b]last stack dump[/b]\n")
        dump.append(rank.stack or "no stack dump recorded for this rank")
        self.query_one("#stack", Static).update(dump)
        log = self.query_one(Log)
        log.clear()
        log.write_lines(log_tail(self.run_dir, rank.local_rank, rank.restart))

    def action_focus_log(self) -> None:
        self.query_one(Log).focus()
