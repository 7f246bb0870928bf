"""Keeping an optional measurement within a share of the step time.

A token bucket: every step earns SHARE of its duration as credit; the
measurement runs when the credit covers what it cost last time. On a GPU
job (steps of 100 ms and more, a measurement of tens of microseconds of
kernel launches) that is every step; on a tiny CPU job, where one full pass
over the gradients is a few percent of the step, it is every few steps.
"""

from __future__ import annotations

SHARE = 0.005
"""Most of the step time a budgeted measurement may take on average."""


class Budget:
    """The first run is warm-up: it pays one-time costs (allocations, a
    kernel's first use), so it is neither charged nor taken as the cost."""

    def __init__(self, share: float = SHARE) -> None:
        self.share = share
        self.credit = 0.0
        self.cost = 0.0
        self.runs = 0

    def due(self, step_s: float) -> bool:
        """Earn this step's credit; say whether the measurement may run now."""
        self.credit = min(self.credit + self.share * step_s, max(self.cost, self.share * step_s) * 2)
        return self.runs < 2 or self.credit >= self.cost

    def spent(self, seconds: float) -> None:
        self.runs += 1
        if self.runs > 1:
            self.cost = seconds
            self.credit -= seconds
