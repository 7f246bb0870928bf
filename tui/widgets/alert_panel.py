"""The alert panel: watchdog verdicts and other events, newest first.

It has a few rows: when the latest events are notices and restarts, the
verdicts that came before them (the stall, the hang) would be pushed out of
sight, so the newest alerts older than what fits stay pinned on its first
rows (PINNED of them at most), marked so. Every event is in the alerts
screen (key a).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from rich.text import Text
from textual.widgets import Static

from ddptop.core.model.events import restart_text
from ddptop.core.model.job import JobState
from ddptop.core.wire import records


def describe(event: Mapping[str, Any]) -> tuple[str, str]:
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
        return "yellow", restart_text(cast(records.GroupRestart, event))
    if kind == "resume":
        damaged = event.get("damaged") or []
        passed = f" (passed over damaged {', '.join(damaged)})" if damaged else ""
        return "green", f"resumed from {event['path'].rsplit('/', 1)[-1]}, at step {event['step'] + 1}{passed}"
    if kind == "wire_error":
        return "yellow", f"{where.strip() + ': ' if where else ''}bad frame refused: {event.get('error', '')}"
    return "cyan", f"{where.strip() + ': ' if where else ''}{event.get('text', '')}"


PINNED = 2
"""Rows at most that keep older alerts in sight, of a panel of more rows than that."""


def lines(events: Sequence[Mapping[str, Any]], rows: int) -> list[tuple[bool, Mapping[str, Any]]]:
    """What a panel of `rows` rows shows: (pinned, event), pinned alerts first, then the newest events."""
    newest = list(reversed(events))
    older_alerts = [event for event in newest[rows:] if event["type"] == "alert"]
    shown_alerts = sum(1 for event in newest[:rows] if event["type"] == "alert")
    pinned = older_alerts[: max(0, min(PINNED, rows - 1, PINNED - shown_alerts))] if rows > PINNED else []
    return [(True, event) for event in pinned] + [(False, event) for event in newest[: rows - len(pinned)]]


class AlertPanel(Static):
    _shown_records: tuple[int, int, int] = (-1, 0, 0)

    def show(self, state: JobState, rows: int | None = None) -> None:
        rows = rows if rows is not None else max(1, self.content_region.height)
        latest = state.events[-1] if state.events else None
        key = (len(state.events), id(latest), rows)
        if key == self._shown_records:
            return
        self._shown_records = key
        text = Text()
        for pinned, event in lines(state.events, rows):
            style, line = describe(event)
            stamp = time.strftime("%H:%M:%S", time.localtime(event.get("wall", 0)))
            text.append("▲ " if pinned else "", style="bold red")
            text.append(f"{stamp} ", style="dim")
            text.append(line + "\n", style=style)
        self.update(text if text else Text("no alerts", style="dim"))
