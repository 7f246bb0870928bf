"""The user's policy for the watchdog: what each fault gets, in one place, for both halves of it.

`ddptop launch`'s options (`--on-nan`, `--clip-grad`, `--on-hang`, ...) become a
WatchPolicy, whose action_for maps each verdict of the supervisor's rules to
an action, and a GuardPolicy, which travels in the ranks' environment so that
the in-rank half (trainer/guard.py) knows what to do at a step without asking
anyone. No torch here: the supervisor and every rank import this module.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Literal, get_args

from ddptop.core import launch_env

OnNan = Literal["auto", "skip", "restart", "stop", "warn"]
ON_NAN: tuple[OnNan, ...] = get_args(OnNan)
"""What a non-finite step gets. skip, restart and stop skip it in the ranks
first (then restart the group, stop the job); warn applies it. auto (the
default) skips it wherever that costs no wait: on CPU ranks, and on GPU
ranks whose optimizer takes a found_inf tensor (torch's fused Adam, AdamW,
SGD); with any other optimizer on a GPU it is applied, and seen a step
late (see guard.py)."""

OnDesync = Literal["warn", "restart", "stop"]
ON_DESYNC: tuple[OnDesync, ...] = get_args(OnDesync)
OnHang = Literal["restart", "stop"]
ON_HANG: tuple[OnHang, ...] = get_args(OnHang)

DESYNC_EVERY = 100
"""Default steps between parameter checksums: one pass over the parameters
every hundred steps."""

STACK_SIGNAL = signal.SIGUSR2
"""The signal that makes a rank write its Python stacks (faulthandler).
SIGUSR1 is left alone: SLURM and Lightning use it for preemption."""


@dataclass(frozen=True)
class GuardPolicy:
    on_nan: OnNan = "auto"
    clip_grad: float | None = None
    desync_every: int = DESYNC_EVERY
    bucket_view: bool = False
    """Build DDP with gradient_as_bucket_view=True where the script does not say (`--bucket-view`):
    its gradients are then views of its buckets, which spares DDP a copy and the memory of every
    gradient, and the guard norms a bucket at a time (guard.Flat). Off unless asked: a script that
    calls detach_() on a gradient, or keeps one past zero_grad for its values, behaves differently."""

    @property
    def skips(self) -> bool:
        """Whether a rank skips a non-finite step where it can without waiting."""
        return self.on_nan != "warn"

    def waits(self, cuda: bool) -> bool:
        """Whether a GPU rank whose optimizer cannot skip on the device reads the verdict on
        the host before the step, to skip it: a wait for the backward pass every step."""
        return cuda and self.on_nan in ("skip", "restart", "stop")

    def to_env(self) -> dict[str, str]:
        env = {launch_env.ON_NAN: self.on_nan, launch_env.DESYNC_EVERY: str(self.desync_every)}
        if self.clip_grad is not None:
            env[launch_env.CLIP_GRAD] = repr(self.clip_grad)
        if self.bucket_view:
            env[launch_env.BUCKET_VIEW] = "1"
        return env

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str] = os.environ) -> GuardPolicy:
        """The rank's copy; a value it cannot read falls back to the default."""
        given = env.get(launch_env.ON_NAN, "auto")
        on_nan: OnNan = next((choice for choice in ON_NAN if choice == given), "auto")
        try:
            clip = float(env[launch_env.CLIP_GRAD]) if launch_env.CLIP_GRAD in env else None
        except ValueError:
            clip = None
        try:
            every = int(env.get(launch_env.DESYNC_EVERY, DESYNC_EVERY))
        except ValueError:
            every = DESYNC_EVERY
        return cls(on_nan, clip if clip and clip > 0 else None, max(0, every), env.get(launch_env.BUCKET_VIEW) == "1")


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
