"""Hang: no rank's step advanced for --hang-timeout (longer before a rank's first step).

The verdict names every stuck rank with the phase it waits in and the step
it last finished, grouped, and which ranks sent nothing at all; the ranks
still talking are the ones whose stacks are worth collecting.
"""

from __future__ import annotations

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.policy import WatchPolicy
from ddptop.supervisor.watching.verdict import Verdict, ranks_text

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

    def observe(self, record: wire.Frame, now: float) -> list[Verdict]:
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
        if not any(now - seen.progress[r] > limit[r] for r in live):
            return []
        # The first rank past the limit is named with every rank stuck alongside
        # it: a rank whose last step landed a moment later waits just the same.
        stuck = [r for r in live if now - seen.progress[r] > limit[r] / 2]
        self._reported = True
        silent = sorted(r for r in stuck if now - seen.heard.get(r, 0.0) > timeout)
        where: dict[tuple[str, int], list[int]] = {}
        for rank in stuck:
            if rank in silent:
                continue
            state = self.state.ranks.get(rank)
            phase, step = (state.phase, state.step) if state else ("startup", -1)
            where.setdefault((phase, step), []).append(rank)
        parts = [
            f"{ranks_text(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {phase} "
            + ("before the first step" if step < 0 else f"after step {step}")
            for (phase, step), ranks in sorted(where.items(), key=lambda item: -len(item[1]))
        ]
        if silent:
            parts.append(f"{ranks_text(silent)} sent nothing for {now - max(seen.heard.get(r, 0.0) for r in silent):.0f} s")
        return [
            Verdict(
                "hang",
                f"no step for {now - min(seen.progress[r] for r in stuck):.0f} s: " + "; ".join(parts),
                ranks=sorted(stuck),
                step=max((s.step for r in stuck if (s := self.state.ranks.get(r))), default=None),
                stacks=sorted(set(stuck) - set(silent)) or sorted(stuck),
            )
        ]
