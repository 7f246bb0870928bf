"""Hang: no rank finished a step, and none worked, for --hang-timeout (longer before a rank's first step).

The disruptive verdict: its action is --on-hang. The diagnosis comes sooner,
from the stall rule (stall.py); this one waits for the user's timeout. A
rank that works (an evaluation, a checkpoint being written: its stack moves,
its model runs forwards, its CPU or its storage is busy outside a
collective) is not hung, however long it takes. The verdict names every
stuck rank where it stands (stuck.py), which ranks sent nothing at all, and
the collective each process group waits in; every stuck rank's stack is
collected, a silent one's too (py-spy reads a stopped process, or one whose
native code holds the GIL).
"""

from __future__ import annotations

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.core.policy import WatchPolicy
from ddptop.supervisor.watching import stuck
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.verdict import Verdict

STARTUP_GRACE_S = 120.0
"""Least time a rank gets before its first step: importing torch, joining
the process group and loading data take far longer than a step, more so
with every rank of a restarted group starting at once."""


class HangRule:
    observes = frozenset({"rank_hello", "step"})

    def __init__(self, policy: WatchPolicy, state: JobState, liveness: Liveness) -> None:
        self.policy = policy
        self.state = state
        self.liveness = liveness
        self._reported = False
        """One verdict per hang: a step or a new hello ends it."""

    def observe(self, record: wire.Record, now: float) -> list[Verdict]:
        self._reported = False
        return []

    def final(self) -> list[Verdict]:
        return []

    def tick(self, now: float) -> list[Verdict]:
        if self._reported:
            return []
        seen = self.liveness
        live = seen.live()
        timeout = self.policy.hang_timeout
        startup = max(timeout, STARTUP_GRACE_S)
        limit = {r: timeout if r in seen.stepped else startup for r in live}
        if not any(now - seen.progress[r] > limit[r] for r in live) or any(self._working(r, now) for r in live):
            return []
        # The first rank past the limit is named with every rank stuck alongside
        # it: a rank whose last step landed a moment later waits just the same.
        stuck_ranks = [r for r in live if now - seen.progress[r] > limit[r] / 2]
        self._reported = True
        _, text = stuck.named(stuck_ranks, self.state, seen, now, silent_after=timeout)
        return [
            Verdict(
                "hang",
                f"no step for {now - min(seen.progress[r] for r in stuck_ranks):.0f} s: {text}",
                ranks=sorted(stuck_ranks),
                step=max((seen.done.get(r, -1) for r in stuck_ranks), default=None),
                stacks=sorted(stuck_ranks),  # py-spy reads a silent rank too: one stopped, or holding the GIL
            )
        ]

    def _working(self, rank: int, now: float) -> bool:
        """Seen working, not stepping, within the timeout: an evaluation or a checkpoint, not a hang."""
        seen = self.liveness
        return seen.moved[rank] > seen.progress[rank] and seen.still(rank, now) < self.policy.hang_timeout
