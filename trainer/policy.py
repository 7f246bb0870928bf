"""The watchdog's settings, as the launcher hands them to every rank.

The supervisor decides them from its command line (`--on-nan`, `--clip-grad`,
`--desync-every`) and passes them in the ranks' environment, so the in-rank
half of the watchdog (guard.py) knows what to do at a step without asking
anyone. No torch here: the supervisor imports this module too.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Literal, get_args

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

_ENV = {
    "on_nan": "DDPTOP_ON_NAN",
    "clip_grad": "DDPTOP_CLIP_GRAD",
    "desync_every": "DDPTOP_DESYNC_EVERY",
    "bucket_view": "DDPTOP_BUCKET_VIEW",
}
STACKS_DIR_ENV = "DDPTOP_STACKS_DIR"


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
        env = {_ENV["on_nan"]: self.on_nan, _ENV["desync_every"]: str(self.desync_every)}
        if self.clip_grad is not None:
            env[_ENV["clip_grad"]] = repr(self.clip_grad)
        if self.bucket_view:
            env[_ENV["bucket_view"]] = "1"
        return env

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str] = os.environ) -> GuardPolicy:
        """The rank's copy; a value it cannot read falls back to the default."""
        given = env.get(_ENV["on_nan"], "auto")
        on_nan: OnNan = next((choice for choice in ON_NAN if choice == given), "auto")
        try:
            clip = float(env[_ENV["clip_grad"]]) if _ENV["clip_grad"] in env else None
        except ValueError:
            clip = None
        try:
            every = int(env.get(_ENV["desync_every"], DESYNC_EVERY))
        except ValueError:
            every = DESYNC_EVERY
        return cls(on_nan, clip if clip and clip > 0 else None, max(0, every), env.get(_ENV["bucket_view"]) == "1")
