"""Every event of the job, newest first, to scroll through: what the alert panel's few rows leave out."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, RichLog, Static

from ddptop.core.format import counted
from ddptop.core.model.job import JobState
from ddptop.tui.widgets.alert_panel import describe


class AlertsScreen(Screen[None]):
    BINDINGS = [Binding("escape,q,a", "app.pop_screen", "back")]

    def __init__(self, state: JobState) -> None:
        super().__init__()
        self.state = state

    def compose(self) -> ComposeResult:
        alerts = sum(1 for event in self.state.events if event["type"] == "alert")
        yield Static(
            f"[b]alerts and events[/b]  {counted(alerts, 'alert')}, {counted(len(self.state.events), 'event')}, newest first",
            id="alerts-title",
        )
        yield RichLog(id="all-alerts", wrap=True, auto_scroll=False)
        yield Footer()

    def on_mount(self) -> None:
        log = self.query_one(RichLog)
        for event in reversed(self.state.events):
            style, line = describe(event)
            text = Text(time.strftime("%H:%M:%S ", time.localtime(event.get("wall", 0))), style="dim")
            text.append(line, style=style)
            log.write(text)
        log.scroll_home(animate=False)
        log.focus()
