"""The dashboard's main screen: the job's header, its charts, its ranks or nodes, its alerts.

A 10 Hz timer pushes only changed values into the widgets, and the charts are
redrawn one a tick, each once a second. Pausing stops the pushes, never the
app's intake.

The rank table comes first: it gets the rows its ranks need, and the charts
take the room left (two rows of them, one, or none on a small terminal).
A job too big for the table shares the screen with the charts half and half.
When the ranks do not fit, the node rollup (a line per node, its worst rank
named) is shown instead until the user picks a view with `n`; enter on a node
drills down to its ranks, escape comes back.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from ddptop.core.model.job import JobState
from ddptop.tui.screens.alerts import AlertsScreen
from ddptop.tui.screens.dialogs import ConfirmScreen
from ddptop.tui.screens.help import HelpScreen
from ddptop.tui.screens.rank_detail import RankDetailScreen
from ddptop.tui.screens.stacks import StacksScreen
from ddptop.tui.widgets.alert_panel import AlertPanel
from ddptop.tui.widgets.charts import Charts, many_ranks
from ddptop.tui.widgets.job_header import JobHeader
from ddptop.tui.widgets.node_table import NodeTable
from ddptop.tui.widgets.rank_table import RankTable

TICK_S = 0.1
PLOT_S = 1.0
MIN_SIZE = (60, 16)
FIXED_ROWS = 8
"""The header (2), the alerts (5) and the footer (1)."""
CHART_ROWS = 9
"""The fewest rows a row of charts is readable in; the charts' caption takes one more."""
ON_THE_JOB = frozenset({"restart_group", "kill_rank"})
"""Actions on the running job, which the footer offers only while the dashboard may act on
one: not in a replay, nor once the job has ended, nor attached read-only."""

View = Literal["auto", "nodes", "ranks"]


class MainScreen(Screen[None]):
    """One job's view. The app feeds `state` and says, through the reactive attributes, what
    the stream and the job allow; what changes redraws through its watch method."""

    BINDINGS = [
        # The app's q and ? (every screen's), named here too so that the footer shows them first.
        Binding("q", "app.quit_dashboard", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("s", "sort", "sort"),
        Binding("S", "reverse_sort", "reverse", show=False),
        Binding("full_stop", "sort(1)", "next column", show=False),  # nvitop's keys for the sort column
        Binding("comma", "sort(-1)", "previous column", show=False),
        Binding("slash", "filter", "filter"),
        Binding("escape", "clear_filter", "clear filter", show=False),
        Binding("p", "pause", "pause"),
        Binding("n", "toggle_nodes", "nodes/ranks"),
        Binding("w", "toggle_window", "window"),
        Binding("enter", "detail", "detail", show=False),
        Binding("l", "logs", "logs"),
        Binding("a", "alerts", "alerts"),
        Binding("R", "restart_group", "restart"),
        Binding("K", "kill_rank", "kill rank"),
        Binding("D", "stacks", "stacks"),
    ]

    class Asked(Message):
        """The user confirmed an action on the job ("restart" or "kill_rank"), or asked a watched
        job's stacks ("stacks"): the app sends it to the supervisor and says what became of it."""

        def __init__(self, action: str, rank: int | None, done: str) -> None:
            super().__init__()
            self.action, self.rank, self.done = action, rank, done

    paused: reactive[bool] = reactive(False, init=False)
    """The display paused (p): the intake goes on, the widgets keep what they showed."""
    view: reactive[View] = reactive[View]("auto", init=False)
    """"auto" (nodes when the ranks do not fit), "nodes" or "ranks": the user's choice."""
    stream_ended: reactive[bool] = reactive(False, init=False)
    """The records have all come: the job ended, its supervisor is gone, or the replay is read."""
    live: reactive[bool] = reactive(False, init=False)
    """A job runs whose supervisor can be asked (the app sets it)."""
    acting: reactive[bool] = reactive(False, init=False)
    """The dashboard may act on that job: restart, kill, a capture, a stack dump (the app sets it)."""

    def __init__(self, state: JobState, run_dir: Path | None, replay: bool, readonly: bool) -> None:
        super().__init__()
        self.state, self.run_dir, self.replay, self.readonly = state, run_dir, replay, readonly
        self.set_reactive(MainScreen.live, not replay)
        self.set_reactive(MainScreen.acting, not replay and not readonly)
        self.body = Vertical(id="main")
        self.header = JobHeader(id="header")
        self.charts = Charts(id="charts")
        self.charts.whole = replay
        self.chart_turn = 0
        self._outside = False
        self.arranged: tuple[int, int, int, bool, int] | None = None
        """The charts' rows, the width, the charts' height when fixed, heatmap or lines, the table's rows."""
        self.table = RankTable(id="ranks")
        self.nodes = NodeTable(id="nodes")
        self.alerts = AlertPanel(id="alerts")
        self.filter_box = Input(placeholder="filter ranks: words match node, rank, host, state", id="filter")

    def compose(self) -> ComposeResult:
        with self.body:
            yield self.header
            yield self.charts
            yield self.table
            yield self.nodes
            yield self.alerts
            yield self.filter_box
        yield Static(f"terminal too small: ddptop needs at least {MIN_SIZE[0]}x{MIN_SIZE[1]}", id="too-small")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(TICK_S, self.tick)
        self.set_interval(PLOT_S / self.charts.count, self.next_chart)
        self.table.focus()

    def on_resize(self, event: events.Resize) -> None:
        small = event.size.width < MIN_SIZE[0] or event.size.height < MIN_SIZE[1]
        self.set_class(small, "too-small")

    def watch_paused(self) -> None:
        self.redraw()

    def watch_view(self) -> None:
        self.redraw()

    def watch_stream_ended(self) -> None:
        self.redraw()
        self.draw_plots()

    def watch_acting(self) -> None:
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Restart and kill are left out of the footer, and their keys do nothing, where the
        dashboard may not act on a job; every rank's stacks are offered for a job watched from
        outside (a rank's own, in its detail, for a job ddptop launched)."""
        if action == "stacks":
            return self.live and self.state.outside
        return action not in ON_THE_JOB or self.acting

    def now(self) -> float:
        """Wall time for ages and uptime: the clock while records come, else the last record's."""
        if not self.replay and not self.stream_ended:
            return time.time()
        return self.state.last_wall

    def status(self) -> str:
        if self.state.exit is not None:
            code = self.state.exit["code"]
            return f"[{'green' if code == 0 else 'red'}]ended, exit {code}[/]"
        if self.stream_ended:
            return "[yellow]replay (no end recorded)[/]" if self.replay else "[yellow]supervisor gone[/]"
        return "[green]running[/]" + (" [yellow]paused[/]" if self.paused else "") + (" read-only" if self.readonly else "")

    def showing_nodes(self) -> bool:
        if self.view != "auto":
            return self.view == "nodes"
        # What the screen could give the table, not what it has: the table is sized to its rows.
        fits = self.app.size.height - FIXED_ROWS - 1
        nodes = {r.node for r in self.state.ranks.values()}
        return len(nodes) > 1 and len(self.state.ranks) > fits

    def tick(self) -> None:
        if self.state.outside != self._outside:  # the run record came: the footer offers the stacks
            self._outside = not self._outside
            self.refresh_bindings()
        if not self.paused:
            self.redraw()

    def redraw(self) -> None:
        """Push the state into the widgets now: the header, the table on screen, the alerts."""
        now = self.now()
        self.header.show(self.state, now, self.status())
        nodes = self.showing_nodes()
        if self.body.has_class("node-view") != nodes:
            self.body.set_class(nodes, "node-view")
            if self.focused in (self.table, self.nodes):
                (self.nodes if nodes else self.table).focus()
        # Only the table on screen is refreshed: at 1,024 ranks the other costs a tick's budget.
        shown = self.nodes if nodes else self.table
        shown.show(self.state, now, not self.replay and not self.stream_ended)
        # A table wider than the screen has a scrollbar under its rows.
        self.share_rows(shown.row_count + (1 if shown.virtual_size.width > shown.size.width else 0))
        self.alerts.show(self.state)

    def share_rows(self, table_rows: int) -> None:
        """Rows for the table first, the rest for the charts (see the module's docstring)."""
        height, width = self.app.size.height, self.app.size.width  # the terminal's: a screen not yet laid out has none
        left = height - FIXED_ROWS
        want = table_rows + 1
        charts_height: int | None = None
        if left - want - 1 >= 2 * CHART_ROWS:
            rows = 2
        elif left - want - 1 >= CHART_ROWS:
            rows = 1
        elif want > left // 2 and left // 2 - 1 >= CHART_ROWS:
            charts_height = left // 2
            rows = 2 if charts_height - 1 >= 2 * CHART_ROWS else 1
        else:
            rows = 0
        if self.state.outside:  # no steps to chart: the ranks take the room
            rows, charts_height = 0, None
        many = many_ranks(self.state)
        arrangement = (rows, width, charts_height or 0, many, want)
        if arrangement == self.arranged:
            return
        self.arranged = arrangement
        self.charts.place(rows, width, many)
        self.charts.styles.height = charts_height if charts_height is not None else "1fr"
        for table in (self.table, self.nodes):
            table.styles.height = "1fr" if rows == 0 or charts_height is not None else want

    def draw_plots(self) -> None:
        """Every chart, now (the ticks redraw one at a time)."""
        if self.charts.display:
            self.charts.show(self.state, self.now())

    def next_chart(self) -> None:
        """One chart a tick, each redrawn once every PLOT_S."""
        if not self.paused and self.charts.display:
            self.chart_turn = (self.chart_turn + 1) % self.charts.count
            self.charts.show(self.state, self.now(), self.chart_turn)

    def action_toggle_window(self) -> None:
        self.charts.whole = not self.charts.whole
        self.draw_plots()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    def action_alerts(self) -> None:
        self.app.push_screen(AlertsScreen(self.state))

    def action_sort(self, step: int = 1) -> None:
        header = self.table.cycle_sort(step)
        self.notify(f"sorted by {header}", timeout=2)
        self.redraw()

    def action_reverse_sort(self) -> None:
        self.table.reverse_sort()
        self.redraw()

    def action_filter(self) -> None:
        self.filter_box.add_class("shown")
        self.filter_box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.table.filter_text = event.value
        self.redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.table.focus()

    class Left(Message):
        """Escape with nothing left to clear: back to the job list, where the app came from one."""

    def action_clear_filter(self) -> None:
        if not self.filter_box.has_class("shown") and self.table.only_node is None:
            self.post_message(self.Left())
        self.filter_box.value = ""
        self.filter_box.remove_class("shown")
        if self.table.only_node is not None:  # back from a drill-down to the rollup
            self.table.only_node = None
            self.view = "nodes"
        self.redraw()
        (self.nodes if self.showing_nodes() else self.table).focus()

    def action_toggle_nodes(self) -> None:
        self.table.only_node = None
        self.view = "ranks" if self.showing_nodes() else "nodes"
        (self.nodes if self.view == "nodes" else self.table).focus()

    def action_pause(self) -> None:
        self.paused = not self.paused

    def action_detail(self) -> None:
        if self.showing_nodes():
            node = self.nodes.selected_node()
            if node is not None:
                self.table.only_node = node
                self.view = "ranks"
                self.table.focus()
                self.notify(f"node {node}'s ranks; esc goes back to the nodes", timeout=3)
            return
        self.open_detail(logs=False)

    def action_logs(self) -> None:
        self.open_detail(logs=True)

    def open_detail(self, logs: bool) -> None:
        rank = self.table.selected_rank()
        if rank is not None:
            detail = RankDetailScreen(self.state, rank, self.run_dir, self.now, self.charts.whole, focus_log=logs)
            detail.live, detail.acting = self.live, self.acting
            self.app.push_screen(detail)

    def action_stacks(self) -> None:
        """Every rank's stacks, read now (in non-blocking mode) by the job's watcher, grouped."""
        self.post_message(self.Asked("stacks", None, "every rank's stacks asked for: they show as they come"))
        self.app.push_screen(StacksScreen(self.state))

    def action_restart_group(self) -> None:
        if not self.acting:
            self.notify("no running job to restart", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.post_message(self.Asked("restart", None, "restart requested: torchrun restarts the group within --max-restarts"))

        self.app.push_screen(ConfirmScreen("Restart the whole worker group (kill every rank)?"), answered)

    def action_kill_rank(self) -> None:
        rank = self.table.selected_rank()
        if not self.acting or rank is None:
            self.notify("no running rank to kill", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.post_message(self.Asked("kill_rank", rank, f"rank {rank} killed"))

        self.app.push_screen(ConfirmScreen(f"Kill rank {rank} (SIGKILL)?"), answered)
