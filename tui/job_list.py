"""The jobs on this host, to choose one from, as nvitop lists processes: `ddptop` with several jobs.

The rows are plain data the command line found (ddptop/top.py): the dashboard
never reads the system itself. Enter opens the job under the cursor (the app
returns its index), escape or q leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static


@dataclass(frozen=True)
class JobRow:
    """One job as the list shows it."""

    id: int
    launcher: str
    ranks: str
    """ "2 of 2", or "3 of 4" when some are not on this host or gone."""
    command: str
    said: str = ""
    """What looks wrong at a glance (a rank stopped, a zombie), or nothing."""


class JobList(App[int | None]):
    CSS_PATH = "ddptop.tcss"
    TITLE = "ddptop"
    BINDINGS = [
        Binding("enter", "open", "open"),
        Binding("escape,q", "leave", "quit"),
    ]

    def __init__(self, rows: list[JobRow], aside: str = "") -> None:
        """aside: one line under the title, of what could not be read."""
        super().__init__()
        self.rows, self.aside = rows, aside

    def compose(self) -> ComposeResult:
        title = f"{len(self.rows)} PyTorch distributed jobs on this host: enter opens one"
        yield Static(title + (f"\n[dim]{self.aside}[/]" if self.aside else ""), id="job-list-title")
        table: DataTable[str] = DataTable(id="job-list", cursor_type="row", zebra_stripes=True)
        table.add_columns("JOB", "LAUNCHER", "RANKS", "SEEN", "COMMAND")
        for row in self.rows:
            table.add_row(str(row.id), row.launcher, row.ranks, row.said or "-", row.command)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.exit(event.cursor_row)

    def action_open(self) -> None:
        self.exit(self.query_one(DataTable).cursor_row)

    def action_leave(self) -> None:
        self.exit(None)
