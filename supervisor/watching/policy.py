"""What the watchdog does about each kind of verdict: the user's policy, mapped
to actions in one place.

The rules (rules/) only say what they saw; `action_for` decides, from the
options `ddptop launch` was given, whether a verdict restarts the worker
group, stops the job or is an alert alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ddptop.trainer.policy import OnDesync, OnHang, OnNan

HANG_TIMEOUT_S = 300.0
"""Default: generous for a first step that compiles, well under NCCL's 10 min."""

NO_PROGRESS = 3
"""Default: attempts in a row that get no further before the job is stopped (rules/no_progress.py)."""

CRASH_LOOP = 3
CRASH_LOOP_WINDOW_S = 600.0
"""Default: three alike failures in ten minutes are a loop, not bad luck."""

Action = Literal["none", "restart", "stop"]
"""What is done about a verdict: nothing more than the alert, a restart of the worker group, a stop of the job."""
NONE: Action = "none"
RESTART: Action = "restart"
STOP: Action = "stop"


@dataclass(frozen=True)
class Started:
    """How the script was started (supervisor/launching/style.py): what the
    verdicts about a script that starts its own ranks need to know."""

    style: str = "torchrun"
    script: str = "the script"
    gpus: int | None = None
    """--gpus, when given."""
    port_set_at: str | None = None
    """Where the script sets MASTER_PORT itself, `file:line`."""


@dataclass(frozen=True)
class WatchPolicy:
    on_nan: OnNan = "auto"
    on_desync: OnDesync = "warn"
    on_hang: OnHang = "restart"
    hang_timeout: float = HANG_TIMEOUT_S
    crash_loop: int = CRASH_LOOP
    crash_loop_window: float = CRASH_LOOP_WINDOW_S
    no_progress: int = NO_PROGRESS
    """0: off."""
    started: Started = Started()

    def action_for(self, kind: str) -> Action:
        """The action a verdict of this kind calls for."""
        if kind == "nan":
            return _acting(self.on_nan)
        if kind == "desync":
            return _acting(self.on_desync)
        if kind == "hang":
            return self.on_hang
        if kind in ("crash-loop", "no-progress"):
            return STOP
        return NONE


def _acting(choice: str) -> Action:
    """restart or stop as chosen; anything else (skip, warn, auto) alerts only."""
    return RESTART if choice == RESTART else STOP if choice == STOP else NONE
