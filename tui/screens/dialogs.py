"""Small modal questions: confirm an action; what to do with the job on quit."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmScreen(ModalScreen[bool]):
    """Yes/no before anything that kills a process (as nvitop asks before a signal)."""

    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", id="yes", variant="error")
                yield Button("No (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class QuitScreen(ModalScreen[str | None]):
    """In `launch`: stop the job, or leave it running headless and attachable."""

    BINDINGS = [
        Binding("s", "choose('stop')", "stop the job"),
        Binding("l", "choose('leave')", "leave it running"),
        Binding("escape,c", "choose(None)", "cancel"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Quit the dashboard. The job is still running:")
            with Horizontal(classes="buttons"):
                yield Button("Stop the job (s)", id="stop", variant="error")
                yield Button("Leave it running (l)", id="leave", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
