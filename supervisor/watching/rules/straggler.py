"""Straggler: a rank whose own work per step stays well above the job's median.

Own work is the median data wait and compute, without the all-reduce's wait (RankState.busy_ms): in DDP every rank's
step takes as long as the slowest's, so wall time alone cannot tell them
apart. A rank must be over STRAGGLER_ALERT x for STRAGGLER_TICKS ticks in a
row, with a full enough window, and is alerted again only after it fell
below STRAGGLER_CLEAR x.
"""

from __future__ import annotations

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.supervisor.watching.verdict import Verdict

STRAGGLER_ALERT = 2.0
STRAGGLER_CLEAR = 1.5
STRAGGLER_TICKS = 3
STRAGGLER_MIN_STEPS = 10
STRAGGLER_MIN_SHARE = 0.25
"""A straggler's own work is over the job's median by this share of its step at least: a rank
whose data takes 2 ms where the others' take 1 is no straggler, whatever the ratio."""


class StragglerRule:
    observes: frozenset[str] = frozenset()

    def __init__(self, state: JobState) -> None:
        self.state = state
        self._slow: dict[int, int] = {}
        """rank -> consecutive ticks over the alert ratio."""
        self._straggling: set[int] = set()

    def observe(self, record: wire.Frame, now: float) -> list[Verdict]:
        return []

    def final(self) -> list[Verdict]:
        return []

    def tick(self, now: float) -> list[Verdict]:
        ratios = self.state.straggler_ratios()
        if len(ratios) < 2:
            return []
        verdicts = []
        for rank, ratio in ratios.items():
            state = self.state.ranks[rank]
            if ratio < STRAGGLER_CLEAR:
                self._slow.pop(rank, None)
                self._straggling.discard(rank)
                continue
            busy = state.busy_ms() or 0.0
            gap = busy - busy / ratio
            if (
                ratio < STRAGGLER_ALERT
                or len(state.window.points) < STRAGGLER_MIN_STEPS
                or gap < STRAGGLER_MIN_SHARE * (state.window.step_ms(50) or 0.0)
            ):
                continue
            self._slow[rank] = self._slow.get(rank, 0) + 1
            if self._slow[rank] >= STRAGGLER_TICKS and rank not in self._straggling:
                self._straggling.add(rank)
                verdicts.append(
                    Verdict(
                        "straggler",
                        f"rank {rank} is a straggler: its own work per step is {ratio:.1f}x the job's median "
                        f"({busy:.0f} ms vs {busy / ratio:.0f} ms); the other ranks wait for it in the all-reduce",
                        ranks=[rank],
                        step=state.step,
                        details={"ratio": round(ratio, 2)},
                    )
                )
        return verdicts
