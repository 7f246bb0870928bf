"""What one timed step's collectives took, however they were timed (collective_timer.py on
the host, collective_spans.py on a GPU): the fields its own record carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMM_WAIT = "comm_wait_ms"
"""A timed sharded step's wait in its collectives: the step tracker takes it out of the
step's time for its compute_ms (steps.py), and sends it nowhere."""


@dataclass
class StepComm:
    """What one timed step's collectives took."""

    wait_ms: float = 0.0
    """Of comm_ms, the collectives the rank waited in where it called them."""
    by_group: dict[str, dict[str, float]] = field(default_factory=dict)
    """ms per mesh dimension, per op: {"shard": {"all-gather": 3.1, "reduce-scatter": 1.2}}."""

    @property
    def comm_ms(self) -> float:
        """All of them, end to end, added up."""
        return sum(sum(ops.values()) for ops in self.by_group.values())

    def add(self, group: str, op: str, ms: float, waited: bool) -> None:
        if waited:
            self.wait_ms += ms
        ops = self.by_group.setdefault(group, {})
        ops[op] = ops.get(op, 0.0) + ms

    def values(self) -> dict[str, Any]:
        """The step's comm fields for its own record (StepTracker.optimizer_end): comm_ms,
        comm_dims, and what its compute_ms leaves out (COMM_WAIT); {} when none was timed."""
        if not self.by_group:
            return {}
        return {"comm_ms": self.comm_ms, "comm_dims": self.by_group, COMM_WAIT: self.wait_ms}
