"""Stall: the early diagnosis of a hang, in a window the job's own pace sets, by default.

When no rank has finished a step for the window and every rank has sat
still for it (stack unchanged, no forward, no CPU kept busy), the verdict
names each stuck rank where it stands (stuck.py): which wait in a
collective, which sit elsewhere and where in the code. It is an alert
alone, with stacks collected; what is done about a hang waits for
--hang-timeout (hang.py).

A rank that works while the others wait (rank 0 evaluating alone, a
checkpoint being written) is a pause, not a stall: it gets one notice,
"ranks 1,2,3 wait for rank 0, evaluating at train.py:120 in evaluate", and
no alert.

The window is STALL_PACE steps at the job's usual pace (its ranks' 90th
percentile step: a rare long step, an evaluation's, does not stretch it),
at least STALL_MIN_S; before the first step, the startup grace. Steps under
a second give at most STALL_PACE s. A window no shorter than --hang-timeout
leaves the verdict to the hang rule.
"""

from __future__ import annotations

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.core.model.stats import median
from ddptop.core.policy import WatchPolicy
from ddptop.supervisor.watching import stuck
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.rules.hang import STARTUP_GRACE_S
from ddptop.supervisor.watching.verdict import Verdict, ranks_text

STALL_MIN_S = 15.0
"""Least window: a few slow batches (a new shard opened, a cold cache) are not a stall."""

STALL_PACE = 20
"""Steps' worth of the job's usual step time with no step finished that make a stall."""

DOING = {"eval": "evaluating", "checkpoint": "checkpointing"}
"""What a pause says the working rank does, by its phase; other phases say only where."""

MOVING_S = 3.0
"""A rank seen working this recently is working: heartbeats come once a second, and
its stack may read the same in two of them."""


class StallRule:
    observes: frozenset[str] = frozenset()

    def __init__(self, policy: WatchPolicy, state: JobState, liveness: Liveness) -> None:
        self.policy = policy
        self.state = state
        self.liveness = liveness
        self._said: float | None = None
        """When the last step before the stall or pause said last finished: one verdict and one notice each."""
        self._noted: float | None = None

    def observe(self, record: wire.Record, now: float) -> list[Verdict]:
        return []

    def final(self) -> list[Verdict]:
        return []

    def window(self) -> float:
        seen = self.liveness
        if not any(r in seen.stepped for r in seen.live()):
            return STARTUP_GRACE_S
        paces = [p for r in self.state.ranks.values() if (p := r.window.step_ms(90)) is not None]
        pace = (median(paces) or 0.0) / 1000.0
        return max(STALL_MIN_S, STALL_PACE * pace)

    def tick(self, now: float) -> list[Verdict]:
        seen = self.liveness
        live = seen.live()
        if not live:
            return []
        last_step = max(seen.progress[r] for r in live)
        window = self.window()
        if window >= self.policy.hang_timeout or now - last_step < window:
            return []
        working = sorted(r for r in live if seen.still(r, now) < MOVING_S)
        if working:
            if self._noted == last_step:
                return []
            self._noted = last_step
            return [self._pause(working, [r for r in live if r not in working])]
        if self._said == last_step or min(seen.still(r, now) for r in live) < window:
            return []
        self._said = last_step
        standing, text = stuck.named(live, self.state, seen, now, silent_after=window)
        return [
            Verdict(
                "stall",
                f"no step for {now - last_step:.0f} s: {text}",
                ranks=sorted(r for r, place in standing.items() if not place.waiting) or sorted(live),
                step=max((seen.done.get(r, -1) for r in live), default=None),
                stacks=sorted(live),  # py-spy reads a silent rank too: one stopped, or holding the GIL
                details={"window_s": round(window, 1)},
            )
        ]

    def _pause(self, working: list[int], waiting: list[int]) -> Verdict:
        first = self.state.ranks.get(working[0])
        said = []
        if first is not None:
            if doing := DOING.get(first.phase):
                said.append(doing)
            if first.where:
                said.append(f"at {first.where}")
        at = ", " + " ".join(said) if said else ""
        if waiting:
            text = f"{ranks_text(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for {ranks_text(working)}{at}"
        else:
            text = f"{ranks_text(working)} {'works' if len(working) == 1 else 'work'} between steps{at}"
        return Verdict("pause", text, ranks=working, notice=True)
