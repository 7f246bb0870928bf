"""Straggler: a rank whose own work per step stays well above the job's median.

Own work is its data wait and compute, without the all-reduce's wait
(core/model/lag.py). A rank must be over STRAGGLER_ALERT x, and over by
STRAGGLER_MIN_SHARE of the step, for STRAGGLER_SUSTAIN_S seconds in a row, with a
full enough window; it is alerted again only after it fell below
STRAGGLER_CLEAR x. The median data wait over the window, and the median of
several of DDP's sampled compute times, so that one long step (rank 0
evaluating alone) or one unlucky sampled iteration is no straggler.
"""

from __future__ import annotations

from ddptop.core import wire
from ddptop.core.format import ms
from ddptop.core.model.job import JobState
from ddptop.core.wire.records import WORLD_DIMENSION
from ddptop.supervisor.watching.verdict import Verdict, ranks_text

STRAGGLER_ALERT = 2.0
STRAGGLER_CLEAR = 1.5
STRAGGLER_SUSTAIN_S = 3.0
"""How long a rank must stay over. One sharing a loaded host's cores is over now and then: in
eight clean runs of examples/train.py, 4 ranks on 2 cores, for a second at most."""
STRAGGLER_MIN_STEPS = 10
STRAGGLER_MIN_SHARE = 0.25
"""A straggler's own work is over the job's median by this share of its step at least: a rank
whose data takes 2 ms where the others' take 1 is no straggler, whatever the ratio."""


CAUSE = {
    "input": "slow in its input: it waits {lag.data_ms:.1f} ms a step for its data, against {lag.median_data_ms:.1f}",
    "compute": "slow in its compute: {lag.compute_ms:.1f} ms a step of forward and backward, against {lag.median_compute_ms:.1f}",
}
"""What sets a straggler apart, in words (Lag.cause)."""


def waited_in(state: JobState, straggler: int) -> str:
    """Where the other ranks wait for a straggler, as the verdict ends: DDP's all-reduce; of a
    sharded job, the collective each rank's last timed step took longest in (RankState.comm_dims:
    HSDP's ranks of the straggler's replica wait in the all-gathers within it, the others in the
    all-reduce across replicas), the all-gathers until a step was timed."""
    if not state.sharded:
        return " in the all-reduce"
    places: dict[str, list[int]] = {}
    for rank, other in state.ranks.items():
        dims = other.comm_dims
        if rank == straggler or other.exited or not dims:
            continue
        dim, op = max(((dim, op) for dim, ops in dims.items() for op in ops), key=lambda at: dims[at[0]][at[1]])
        places.setdefault(f"the {op}s" + ("" if dim == WORLD_DIMENSION else f" over {dim}"), []).append(rank)
    if len(places) <= 1:
        return f" in {next(iter(places), 'the all-gathers')}"
    return ": " + ", ".join(f"{ranks_text(ranks)} in {place}" for place, ranks in places.items())


class StragglerRule:
    observes: frozenset[str] = frozenset()

    def __init__(self, state: JobState) -> None:
        self.state = state
        self._over_since: dict[int, float] = {}
        """rank -> when it went over the alert ratio, without a tick under it since."""
        self._straggling: set[int] = set()

    def observe(self, record: wire.Record, now: float) -> list[Verdict]:
        return []

    def final(self) -> list[Verdict]:
        return []

    def tick(self, now: float) -> list[Verdict]:
        lags = self.state.lags()
        if len(lags) < 2:
            return []
        verdicts = []
        for rank, lag in lags.items():
            state = self.state.ranks[rank]
            if lag.ratio < STRAGGLER_CLEAR:
                self._over_since.pop(rank, None)
                self._straggling.discard(rank)
                continue
            if not lag.over(STRAGGLER_ALERT, STRAGGLER_MIN_SHARE) or len(state.window.points) < STRAGGLER_MIN_STEPS:
                self._over_since.pop(rank, None)
                continue
            since = self._over_since.setdefault(rank, now)
            if now - since >= STRAGGLER_SUSTAIN_S and rank not in self._straggling:
                self._straggling.add(rank)
                against, waiting = "the job's median", "the other ranks wait"
                if state.replicas is not None:
                    against, waiting = f"the median of its data-parallel {ranks_text(list(state.replicas))}", "they wait"
                verdicts.append(
                    Verdict(
                        "straggler",
                        f"rank {rank} is a straggler: its own work per step is {lag.ratio:.1f}x {against} "
                        f"({ms(lag.own_ms)} ms vs {ms(lag.median_ms)} ms), {CAUSE[lag.cause].format(lag=lag)}; "
                        f"{waiting} for it{waited_in(self.state, rank)}",
                        ranks=[rank],
                        step=state.step,
                        details={"ratio": round(lag.ratio, 2), "cause": lag.cause},
                    )
                )
        return verdicts
