"""The grad norm of a sharded job's step, added up from its ranks' shares.

A rank whose gradients are DTensors (FSDP2, HSDP, tensor parallelism) and
that took no global norm of them sends its share of the norm's square
(records.Step grad_sq_share; trainer/shard_share.py weighs each piece by the
ranks that hold it). Once every rank of the job has sent its share of a
step, their sum is the square of the norm clip_grad_norm_ would return: that
norm becomes each of those ranks' grad norm. Kept in the job model, so the
supervisor's summaries and exports and every dashboard (live, attached,
replayed) add up the same records the same way.
"""

from __future__ import annotations

import math

KEPT_STEPS = 64
"""Steps whose shares wait for their last rank at most: one that never comes (a rank that died
mid-step) leaves its step out rather than holding shares for ever."""


class ShardedNorm:
    """Each step's shares, until every rank's is in."""

    def __init__(self) -> None:
        self._shares: dict[tuple[int, int], dict[int, float]] = {}
        """(attempt, step) -> rank -> its share, for the steps not complete yet."""
        self.latest: tuple[int, float] | None = None
        """The latest step whose norm was added up, and that norm."""

    @property
    def waiting(self) -> int:
        """Steps whose shares wait for a rank's."""
        return len(self._shares)

    def add(self, attempt: int, step: int, rank: int, share: float, world: int) -> dict[int, float] | None:
        """A rank's share of a step; where it completes the step, each of its ranks' grad norm."""
        key = (attempt, step)
        shares = self._shares.setdefault(key, {})
        shares[rank] = share
        if len(shares) < world:
            if len(self._shares) > KEPT_STEPS:
                del self._shares[min(self._shares)]
            return None
        del self._shares[key]
        norm = math.sqrt(math.fsum(shares.values()))
        self.latest = (step, norm)
        return dict.fromkeys(shares, norm)
