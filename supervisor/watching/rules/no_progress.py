"""No progress: --no-progress attempts in a row that end without getting further, and the job is stopped.

torchrun restarts a failed group until its --max-restarts are spent,
whether or not a restart helps. An attempt made progress when it passed the
furthest step of the attempts before it and, in a job that writes
checkpoints through monitor.checkpoint, wrote one: a restart goes on from
the last checkpoint, so steps past it without a new one are done again.
Attempts that fail in different ways each time (so the crash-loop rule,
which compares failures, says nothing) but never get further are stopped
here, as NVIDIA's resiliency extension does and torchrun does not.

An attempt is judged when torchrun asks to restart after it (its
group_restart record, held by the supervisor until the verdicts are in).
"""

from __future__ import annotations

from ddptop.core import wire
from ddptop.core.policy import WatchPolicy
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.verdict import Verdict


class NoProgressRule:
    observes = frozenset({"step", "checkpoint", "group_restart"})

    def __init__(self, policy: WatchPolicy, liveness: Liveness) -> None:
        self.policy = policy
        self.liveness = liveness
        self._furthest: dict[int, int] = {}
        """attempt -> the furthest step any of its ranks finished."""
        self._checkpointed: set[int] = set()
        """Attempts that wrote a checkpoint."""
        self._judged: set[int] = set()
        self._stuck: list[int] = []
        """The latest attempts, in a row, that made no progress."""

    def observe(self, record: wire.Record, now: float) -> list[Verdict]:
        if record["type"] == "group_restart":
            return self._judge(record["restart"] - 1)
        if record["type"] == "step":
            attempt = self.liveness.attempt.get(record["rank"], 0)
            self._furthest[attempt] = max(self._furthest.get(attempt, -1), record["step"])
        elif record["type"] == "checkpoint":
            self._checkpointed.add(self.liveness.attempt.get(record["rank"], 0))
        return []

    def _judge(self, attempt: int) -> list[Verdict]:
        """The attempt that ended: another in the row, or progress that ends the row."""
        if attempt in self._judged or self.policy.no_progress == 0:
            return []  # every node's torchrun asks alike: the attempt is judged once
        self._judged.add(attempt)
        before = max((step for a, step in self._furthest.items() if a < attempt), default=-1)
        furthest = self._furthest.get(attempt, -1)
        checkpoints_count = bool(self._checkpointed) and attempt not in self._checkpointed
        if furthest > before and not checkpoints_count:
            self._stuck = []
            return []
        self._stuck.append(attempt)
        if len(self._stuck) < self.policy.no_progress:
            return []
        reached = ", ".join(f"attempt {a} to step {self._furthest.get(a, -1)}" for a in self._stuck)
        why = f"past step {before}" if not checkpoints_count else f"past step {before} or to a new checkpoint"
        text = f"{len(self._stuck)} attempts in a row got no further ({why}: {reached}); a restart cannot help, stopping the job"
        self._stuck = []
        return [Verdict("no-progress", text.replace("to step -1", "before its first step"), step=max(furthest, before, 0))]

    def tick(self, now: float) -> list[Verdict]:
        return []

    def final(self) -> list[Verdict]:
        return []
