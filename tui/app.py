"""The ddptop dashboard: one Textual app for launch, attach and replay.

Records arrive in an async worker on the app's own loop (no threads, so no
call_from_thread) and are folded into a plain JobState; a 10 Hz timer pushes
only changed values into the widgets, and charts are redrawn once a second.
Pausing the display stops the pushes, never the intake.

The rank table comes first: it gets the rows its ranks need, and the charts
take the room left (two rows of them, one, or none on a small terminal).
A job too big for the table shares the screen with the charts half and half.

When a job's ranks do not fit the table, the node rollup (one line per node,
its worst rank named) is shown instead, until the user picks a view with
`n`; enter on a node drills down to its ranks, escape comes back.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Footer, Input, Static

from ddptop.core.model.job import JobState
from ddptop.tui.screens.alerts import AlertsScreen
from ddptop.tui.screens.dialogs import ConfirmScreen, QuitScreen
from ddptop.tui.screens.help import HelpScreen
from ddptop.tui.screens.rank_detail import RankDetailScreen
from ddptop.tui.source import Source
from ddptop.tui.widgets.alert_panel import AlertPanel
from ddptop.tui.widgets.charts import Charts, many_ranks
from ddptop.tui.widgets.job_header import JobHeader
from ddptop.tui.widgets.node_table import NodeTable
from ddptop.tui.widgets.rank_table import RankTable

YIELD_EVERY = 200
"""Records folded before a keypress gets its turn: a read from the socket holds hundreds, and
at 1,024 ranks folding them all in one go kept a key waiting a tenth of a second."""
TICK_S = 0.1
PLOT_S = 1.0
MIN_SIZE = (60, 16)
FIXED_ROWS = 8
"""The header (2), the alerts (5) and the footer (1)."""
CHART_ROWS = 9
"""The fewest rows a row of charts is readable in; the charts' caption takes one more."""
GONE = "the supervisor is gone (its job has ended): nothing was sent"
ON_THE_JOB = frozenset({"restart_group", "kill_rank"})
"""Actions on the running job, which the footer offers only while there is one: not in a
replay, nor once the job has ended, nor in a dashboard attached read-only (a rank's detail
offers its profile capture and its stack dump alike)."""


class DdptopApp(App[str | None]):
    """mode is "launch", "attach" or "replay"; the result says what quit chose.

    What the user and the stream change about the view is reactive, and each change redraws
    through its watch method: nothing asks for a forced refresh."""

    CSS_PATH = "ddptop.tcss"
    TITLE = "ddptop"
    BINDINGS = [
        Binding("q", "quit_dashboard", "quit"),
        Binding("ctrl+q", "quit_dashboard", "quit", show=False, priority=True),
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
    ]

    def __init__(self, source: Source, mode: str, run_dir: Path | None = None, readonly: bool = False) -> None:
        super().__init__()
        self.source = source
        self.mode = mode
        self.run_dir = run_dir
        self.readonly = readonly
        """Attached to watch only (`ddptop attach --readonly`, nvitop's flag): the job is neither
        restarted, killed, profiled nor held still for a stack dump from here; its ranks' log
        tails are still read."""
        self.state = JobState()
        self.stopping = False
        """In `launch`, the user chose to stop the job: the dashboard closes when it has ended."""
        self.leaving = False
        """Set as the app begins to leave: the job's end and a second q may both ask it to, once."""

        # The main screen's widgets, kept so that refreshing them works
        # whichever screen (detail, help, a dialog) is in front.
        self.main = Vertical(id="main")
        self.header = JobHeader(id="header")
        self.charts = Charts(id="charts")
        self.charts.whole = mode == "replay"
        self.chart_turn = 0
        self.arranged: tuple[int, int, int, bool, int] | None = None
        """The charts' rows, the width, the charts' height when fixed, heatmap or lines, the table's rows."""
        self.offered_job_actions = self.may_act()
        """Whether the footer offers ON_THE_JOB: redrawn when the job stops running."""
        self.table = RankTable(id="ranks")
        self.nodes = NodeTable(id="nodes")
        self.alerts = AlertPanel(id="alerts")
        self.filter_box = Input(placeholder="filter ranks: words match node, rank, host, state", id="filter")

    def compose(self) -> ComposeResult:
        with self.main:
            yield self.header
            yield self.charts
            yield self.table
            yield self.nodes
            yield self.alerts
            yield self.filter_box
        yield Static(f"terminal too small: ddptop needs at least {MIN_SIZE[0]}x{MIN_SIZE[1]}", id="too-small")
        yield Footer()

    paused: reactive[bool] = reactive(False, init=False)
    """The display paused (p): the intake goes on, the widgets keep what they showed."""
    view: reactive[str] = reactive("auto", init=False)
    """"auto" (nodes when the ranks do not fit), "nodes" or "ranks": the user's choice."""
    stream_ended: reactive[bool] = reactive(False, init=False)
    """The records have all come: the job ended, its supervisor is gone, or the replay is read."""

    def watch_paused(self) -> None:
        self.redraw()

    def watch_view(self) -> None:
        self.redraw()

    def watch_stream_ended(self) -> None:
        self.redraw()
        self.draw_plots()

    def on_mount(self) -> None:
        self.consume()
        self.set_interval(TICK_S, self.tick)
        self.set_interval(PLOT_S / self.charts.count, self.next_chart)
        self.table.focus()

    def on_resize(self, event: events.Resize) -> None:
        small = event.size.width < MIN_SIZE[0] or event.size.height < MIN_SIZE[1]
        self.screen.set_class(small, "too-small")

    @work(exclusive=True, group="source")
    async def consume(self) -> None:
        ingested = 0
        try:
            async for record in self.source.records():
                self.state.ingest(record)
                ingested += 1
                if ingested % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            self.source.finished(self.state)
        except OSError as exc:
            self.notify(f"lost the supervisor: {exc}", severity="error", timeout=10)
        self.stream_ended = True
        if self.stopping:
            await self.leave("stop")
            return
        if self.source.live:
            end = self.state.exit
            message = "the job has ended" + (f" (exit {end['code']})" if end else "; the supervisor is gone")
            self.notify(message + ": showing its last state", timeout=10)

    def now(self) -> float:
        """Wall time for ages and uptime: the clock when live, the last record in replay."""
        if self.source.live and not self.stream_ended:
            return time.time()
        return self.state.last_wall

    def status(self) -> str:
        if self.state.exit is not None:
            code = self.state.exit["code"]
            return f"[{'green' if code == 0 else 'red'}]ended, exit {code}[/]"
        if self.stream_ended:
            return "[yellow]supervisor gone[/]" if self.source.live else "[yellow]replay (no end recorded)[/]"
        return "[green]running[/]" + (" [yellow]paused[/]" if self.paused else "") + (" read-only" if self.readonly else "")

    def showing_nodes(self) -> bool:
        if self.view != "auto":
            return self.view == "nodes"
        # What the screen could give the table, not what it has: the table is sized to its rows.
        fits = self.size.height - FIXED_ROWS - 1
        nodes = {r.node for r in self.state.ranks.values()}
        return len(nodes) > 1 and len(self.state.ranks) > fits

    def tick(self) -> None:
        """Ten times a second: the footer's offers follow the job, and the view the state, unless paused."""
        if self.offered_job_actions != self.may_act():
            self.offered_job_actions = not self.offered_job_actions
            self.refresh_bindings()
        for screen in self.screen_stack:  # a rank's detail offers and asks what the job allows now
            if isinstance(screen, RankDetailScreen):
                screen.live, screen.acting = self.job_running(), self.offered_job_actions
        if not self.paused:
            self.redraw()

    def redraw(self) -> None:
        """Push the state into the widgets now: the header, the table on screen, the alerts."""
        now = self.now()
        live = self.source.live and not self.stream_ended
        self.header.show(self.state, now, self.status())
        nodes = self.showing_nodes()
        if self.main.has_class("node-view") != nodes:
            self.main.set_class(nodes, "node-view")
            if self.focused in (self.table, self.nodes):
                (self.nodes if nodes else self.table).focus()
        # Only the table on screen is refreshed: at 1,024 ranks the other costs a tick's budget.
        shown = self.nodes if nodes else self.table
        shown.show(self.state, now, live)
        # A table wider than the screen has a scrollbar under its rows.
        self.share_rows(shown.row_count + (1 if shown.virtual_size.width > shown.size.width else 0))
        self.alerts.show(self.state)

    def share_rows(self, table_rows: int) -> None:
        """Rows for the table first, the rest for the charts (see the module's docstring)."""
        height, width = self.size.height, self.size.width
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

    def job_running(self) -> bool:
        return self.source.live and not self.stream_ended and self.state.exit is None

    def may_act(self) -> bool:
        """Whether the dashboard may act on the job: restart, kill, a profile capture, a stack dump."""
        return self.job_running() and not self.readonly

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Restart and kill are left out of the footer, and their keys do nothing, where no job runs
        or the dashboard is read-only."""
        return action not in ON_THE_JOB or self.offered_job_actions

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_alerts(self) -> None:
        self.push_screen(AlertsScreen(self.state))

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

    def action_clear_filter(self) -> None:
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

    def _open_detail(self, logs: bool) -> None:
        rank = self.table.selected_rank()
        if rank is not None:
            detail = RankDetailScreen(self.state, rank, self.run_dir, self.now, self.charts.whole, focus_log=logs)
            detail.live, detail.acting = self.job_running(), self.offered_job_actions
            self.push_screen(detail)

    async def on_rank_detail_screen_asked(self, message: RankDetailScreen.Asked) -> None:
        """A rank's detail asks for its log tail, a capture or its stacks: sent to the supervisor."""
        asks = {"log_tail": self.ask_log, "profile": self.ask_profile, "stacks": self.ask_stacks}
        if not await asks[message.action](message.rank) and message.action != "log_tail":
            self.notify(GONE, severity="warning")

    async def ask_log(self, rank: int) -> bool:
        """Ask the supervisor for a rank's log tail, which the rank's own node reads and sends."""
        if not self.job_running():
            return False
        return await self.source.command("log_tail", rank)

    async def ask_profile(self, rank: int) -> bool:
        """Ask the supervisor for a capture of the rank's next steps (the supervisor says how many)."""
        if not self.may_act():
            return False
        return await self.source.command("profile", rank)

    async def ask_stacks(self, rank: int) -> bool:
        """Ask the supervisor to dump the rank's stacks now (py-spy, else faulthandler), on its node."""
        if not self.may_act():
            return False
        return await self.source.command("stacks", rank)

    def action_detail(self) -> None:
        if self.showing_nodes():
            node = self.nodes.selected_node()
            if node is not None:
                self.table.only_node = node
                self.view = "ranks"
                self.table.focus()
                self.notify(f"node {node}'s ranks; esc goes back to the nodes", timeout=3)
            return
        self._open_detail(logs=False)

    def action_logs(self) -> None:
        self._open_detail(logs=True)

    async def ask(self, action: str, rank: int | None, done: str) -> None:
        """Send a command the user confirmed, and say what became of it."""
        if await self.source.command(action, rank):
            self.notify(done)
        else:
            self.notify(GONE, severity="warning")

    def action_restart_group(self) -> None:
        if not self.may_act():
            self.notify("no running job to restart", severity="warning")
            return

        async def answered(yes: bool | None) -> None:
            if yes:
                await self.ask("restart", None, "restart requested: torchrun restarts the group within --max-restarts")

        self.push_screen(ConfirmScreen("Restart the whole worker group (kill every rank)?"), answered)

    def action_kill_rank(self) -> None:
        rank = self.table.selected_rank()
        if not self.may_act() or rank is None:
            self.notify("no running rank to kill", severity="warning")
            return

        async def answered(yes: bool | None) -> None:
            if yes:
                await self.ask("kill_rank", rank, f"rank {rank} killed")

        self.push_screen(ConfirmScreen(f"Kill rank {rank} (SIGKILL)?"), answered)

    async def action_quit_dashboard(self) -> None:
        if self.stopping:  # asked again while the job stops: close now, and leave it stopping
            await self.leave("stop")
            return
        if self.mode != "launch" or not self.job_running():
            await self.leave(None)
            return

        async def chosen(choice: str | None) -> None:
            if choice == "stop":
                # Closed at the job's end (consume), so that `launch` returns once its GPUs are free,
                # with the job's exit status, as after Ctrl-C headless.
                self.stopping = True
                await self.source.command("stop")  # a supervisor already gone has nothing left to stop
                if not self.stream_ended:
                    self.notify("stopping the job: the dashboard closes at its end (q: close now)", timeout=30)
                    return
            if choice is not None:
                await self.leave(choice)

        self.push_screen(QuitScreen(), chosen)

    async def leave(self, choice: str | None) -> None:
        """Close the connection and leave the app, once, with what becomes of the job."""
        if not self.leaving:
            self.leaving = True
            await self.source.close()
            self.exit(choice)
