"""A supervised job's lifecycle: one phase, its transitions in one place, and how the job ended.

As torch elastic's agent keeps a WorkerState and one run loop over it, the
supervisor keeps one Phase here. It asks this object, never a set of flags,
whether it is stopping and how the job ended. Restarts of the worker group
that wait (for the watchdog's judgement of a failure, or for a group between
attempts to be up) are the RestartGate's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from ddptop.core.wire import records

EndState = Literal["finished", "stopped", "failed"]


class Phase(enum.Enum):
    STARTING = "starting"
    """torchrun is not started yet."""
    RUNNING = "running"
    """torchrun runs the worker group (restarting it, between two attempts, too)."""
    STOPPING = "stopping"
    """A stop was asked (a signal, `ddptop stop`, the watchdog): torchrun is being stopped."""
    ENDED = "ended"
    """torchrun has exited; the job's outcome is known."""


@dataclass(frozen=True)
class Outcome:
    """How the job ended, as meta.json, the exit record and `ddptop launch`'s status say it."""

    state: EndState
    code: int
    """The exit status: the watchdog's for a job it stopped, 128+N for one stopped by signal N, else torchrun's."""
    signal: int | None
    """The signal that stopped the job, where a signal (the user's) is what ended it."""


class Lifecycle:
    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self._signal: int | None = None
        """The signal torchrun was stopped with."""
        self._code: int | None = None
        """The exit status the watchdog stopped the job with."""
        self.why: str | None = None
        """What explains a failed job, for `ddptop ls`: the verdict that stopped it, else its first crash."""
        self.torchrun_failed: str | None = None
        """torchrun's own failure, as its probe said it: why a run failed with no verdict to say."""

    def started(self) -> None:
        """torchrun runs."""
        self._move(Phase.STARTING, Phase.RUNNING)

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked: nothing new is started, no restart let through."""
        return self.phase in (Phase.STOPPING, Phase.ENDED)

    def stop(self, signum: int, code: int | None = None) -> bool:
        """A stop asked with a signal, and by the watchdog with code (the exit status). True the first
        time: stop torchrun now. False when the job stops already: a second ask kills it."""
        if code is not None:
            self._code = code
        if self.stopping:
            return False
        self.phase, self._signal = Phase.STOPPING, signum
        return True

    def explained_by(self, verdict: str, stops: bool) -> None:
        """A verdict explains a failed job: the one that stopped it, else the first crash."""
        if stops or self.why is None:
            self.why = verdict

    def end(self, torchrun_code: int) -> Outcome:
        """torchrun exited with torchrun_code: the job's outcome."""
        self.phase = Phase.ENDED
        if self._code is not None:
            return Outcome("finished" if self._code == 0 else "failed", self._code, None)
        if self._signal is not None:
            code = 128 + self._signal
            return Outcome("stopped", code, self._signal)
        return Outcome("finished" if torchrun_code == 0 else "failed", torchrun_code, None)

    def failed_why(self, code: int, any_rank: bool) -> str:
        """Why the run failed: the verdict that explains it, else torchrun's own failure, else its
        exit status and whether any rank ever started."""
        if self.why is not None:
            return self.why
        if self.torchrun_failed is not None:
            return self.torchrun_failed
        return f"torchrun exited with status {code}" + ("" if any_rank else " before any rank started")

    def _move(self, before: Phase, after: Phase) -> None:
        if self.phase is not before:
            raise RuntimeError(f"the job is {self.phase.value}, not {before.value}: it cannot go to {after.value}")
        self.phase = after


class RestartGate:
    """Restarts of the worker group that wait: those torchrun's probe holds until the watchdog has
    judged the failure that caused them, and one a user asked while the group was between attempts,
    until the group's first rank is up (there is nothing to kill before)."""

    def __init__(self) -> None:
        self.held: list[records.GroupRestart] = []
        """torchrun's group_restart records, each held by its node's probe."""
        self.asked: str | None = None
        """A restart asked between attempts, in words."""

    def hold(self, restart: records.GroupRestart) -> None:
        self.held.append(restart)

    def release(self) -> list[records.GroupRestart]:
        """The held restarts, let go: what each node's probe is told (restart_go)."""
        released, self.held = self.held, []
        return released

    def ask_when_up(self, asked: str) -> None:
        self.asked = asked

    def up(self) -> str | None:
        """A rank of the new attempt said hello: the restart asked meanwhile, now due (once)."""
        asked, self.asked = self.asked, None
        return asked
