"""How far each rank's own work per step lags the job's: where stragglers are judged.

In DDP every rank's step takes as long as the slowest one's, because the
fast ranks wait for it in the all-reduce; so step time cannot tell them
apart. What sets a straggler apart is that its time is its own: its wait for
its data (timed every step) and its compute (what DDP times on its sampled
iterations, RankState.compute_ms). The dashboard highlights a lagging rank
and the watchdog alerts on one from these same figures.

A lag counts only when it is both a ratio and a share of the step: a rank
whose data takes 0.04 ms where the others' take 0.02 is twice as slow and
costs nobody anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ddptop.core.model.rank import RankState
from ddptop.core.model.stats import median

HIGHLIGHT_RATIO = 1.25
"""The dashboard marks a rank whose own work is this much over the job's median..."""
HIGHLIGHT_SHARE = 0.1
"""... and over it by this share of the step at least; the watchdog alerts from higher ones
(supervisor/watching/rules/straggler.py)."""


@dataclass(frozen=True)
class Lag:
    """One rank's own work per step against the job's median."""

    own_ms: float
    median_ms: float
    step_ms: float
    """The job's median step: what the lag costs every other rank is a share of it."""
    data_ms: float = 0.0
    """Of own_ms, its wait for data; the rest is its compute."""
    median_data_ms: float = 0.0
    """The median of its peers' data waits."""

    @property
    def ratio(self) -> float:
        return self.own_ms / self.median_ms

    @property
    def share(self) -> float:
        """The other ranks' wait for this one, as a share of the step."""
        return (self.own_ms - self.median_ms) / self.step_ms if self.step_ms else 0.0

    def over(self, ratio: float, share: float) -> bool:
        return self.ratio >= ratio and self.share >= share

    @property
    def compute_ms(self) -> float:
        return self.own_ms - self.data_ms

    @property
    def median_compute_ms(self) -> float:
        return self.median_ms - self.median_data_ms

    @property
    def cause(self) -> str:
        """Which part of its own work sets it apart, as TraceML classes a straggler: "input" (its
        data wait) or "compute", whichever is further over its peers' median."""
        over_input = self.data_ms - self.median_data_ms
        return "input" if over_input >= self.compute_ms - self.median_compute_ms else "compute"


DATA_ALONE = "the data wait alone, until DDP has timed every rank's compute 3 times"
"""What the ranks' charts say while own work leaves compute out (counts_compute)."""


def counts_compute(ranks: Iterable[RankState]) -> bool:
    """Whether own work counts compute: once every one of these ranks has a settled estimate
    of it, so that one rank's compute is never set against another's nothing."""
    estimates = [r.compute_ms() for r in ranks]
    return bool(estimates) and None not in estimates


def peer_groups(ranks: Iterable[RankState]) -> list[list[int]]:
    """The rank numbers each rank's own work is set against, as lags() sets it: every rank's,
    or where ranks are data-parallel with part of the job, each group of them. For the charts,
    which draw the history's per-rank arrays."""
    groups: dict[tuple[int, ...] | None, list[int]] = {}
    for rank in ranks:
        groups.setdefault(rank.replicas, []).append(rank.rank)
    return [sorted(members) for members in groups.values()]


def lags(ranks: Iterable[RankState]) -> dict[int, Lag]:
    """Each live rank's lag, in one pass (a per-rank call would redo the job's median for
    every rank, quadratic in the world size). Own work is the data wait and, where
    the live ranks count it (counts_compute), the compute.

    A rank is set against the ranks that do its work: every rank, or where it is
    data-parallel with part of the job (RankState.replicas), those. A pipeline's stages do different
    work by design, and a later stage's wait for its activations reads as its data wait; a
    rank with no replica has none to lag.
    """
    live = [r for r in ranks if not r.exited and r.window.points]
    counted = counts_compute(live)
    own: dict[int, float] = {}
    waits: dict[int, float] = {}
    for rank in live:
        data = rank.window.data_ms(50)
        compute = rank.compute_ms() if counted else None
        if data is not None or compute is not None:
            own[rank.rank] = (data or 0.0) + (compute or 0.0)
            waits[rank.rank] = data or 0.0
    step = median([x for r in live if (x := r.window.step_ms(50)) is not None]) or 0.0
    out: dict[int, Lag] = {}
    for members in peer_groups(live):
        measured = [r for r in members if r in own]
        middle = median([own[r] for r in measured])
        if middle:
            middle_wait = median([waits[r] for r in measured]) or 0.0
            out.update({r: Lag(own[r], middle, step, waits[r], middle_wait) for r in measured})
    return out
