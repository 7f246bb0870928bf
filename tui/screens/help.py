"""The help screen: every key, what it does."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = [
    (
        "enter",
        "rank detail: its GPU's temperature and power, its step and comm time over the run, its stack, its own log tail; on a node, its ranks",
    ),
    ("← / →", "scroll a table wider than the terminal a column at a time (its node and rank stay)"),
    ("n", "node rollup (one line per node, worst rank named) / every rank"),
    ("s / S", "sort by the next column / reverse the order (. and , as in nvitop: the next / the previous column)"),
    ("/", "filter ranks (words match node, rank, host, state); esc clears, or goes back to the nodes"),
    ("p", "pause the display (data keeps arriving)"),
    ("w", "charts: the last ten minutes / the whole run (alerts red, restarts yellow on the time axis)"),
    ("l", "logs of the selected rank"),
    ("P", "in a rank's detail, while the job runs: capture its next 10 steps with torch.profiler (ddptop profile in a shell)"),
    (
        "D",
        "in a rank's detail, while the job runs: dump its stacks now, every thread, native frames too (py-spy); "
        "on a job watched from outside (ddptop alone), every rank's stacks, grouped",
    ),
    ("a", "every alert and event of the job, newest first (the panel pins the latest alerts it has no room for)"),
    ("R", "restart the worker group, while the job runs (asks first)"),
    ("K", "kill the selected rank, while the job runs (asks first)"),
    ("?", "this help"),
    ("q", "quit; in launch, choose to stop the job or leave it running"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        """A row a key: its text wraps beside the key, not under it, on a narrow terminal."""
        with VerticalScroll(classes="dialog", id="help"):
            yield Static("[b]ddptop keys[/b]\n")
            for key, what in KEYS:
                with Horizontal(classes="key-row"):
                    yield Static(key, classes="key")
                    yield Static(what, classes="what", markup=False)
            yield Static("\n[dim]esc to close[/dim]")
