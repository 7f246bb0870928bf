"""The alert panel: watchdog verdicts and other events, newest first."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from ddptop.core.model.events import restart_text
from ddptop.core.model.job import JobState


def describe(event: dict) -> tuple[str, str]:
    """(style, text) of one event record."""
    kind = event["type"]
    where = "".join(
        part
        for part in (
            f" rank {event['rank']}" if event.get("rank") is not None else "",
            f" step {event['step']}" if event.get("step") is not None else "",
        )
    )
    if kind == "alert":
        return "bold red", f"{where.strip() or 'job'}: {event.get('text', '')}"
    if kind == "exit":
        code = event.get("code")
        return ("green" if code == 0 else "bold red"), f"job ended, exit {code}"
    if kind == "group_restart":
        return "yellow", restart_text(event)
    if kind == "resume":
        damaged = event.get("damaged") or []
        passed = f" (passed over damaged {', '.join(damaged)})" if damaged else ""
        return "green", f"resumed from {event['path'].rsplit('/', 1)[-1]}, at step {event['step'] + 1}{passed}"
    if kind == "wire_error":
        return "yellow", f"{where.strip() + ': ' if where else ''}bad frame refused: {event.get('error', '')}"
    return "cyan", f"{where.strip() + ': ' if where else ''}{event.get('text', '')}"


class AlertPanel(Static):
    _shown_records: tuple[int, int] = (-1, 0)

    def show(self, state: JobState, rows: int = 50) -> None:
        latest = state.events[-1] if state.events else None
        key = (len(state.events), id(latest))
        if key == self._shown_records:
            return
        self._shown_records = key
        text = Text()
        for event in list(reversed(state.events))[:rows]:
            style, line = describe(event)
            stamp = time.strftime("%H:%M:%S", time.localtime(event.get("wall", 0)))
            text.append(f"{stamp} ", style="dim")
            text.append(line + "\n", style=style)
        self.update(text if text else Text("no alerts", style="dim"))
