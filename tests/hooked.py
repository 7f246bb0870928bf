"""ddptop's torch hooks installed in this process as in a rank, and what they emit: for the tests
of the hooks on models that torch shards (test_sharded.py, test_fsdp1.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ddptop.core.policy import GuardPolicy
from ddptop.trainer import hooks, patches
from ddptop.trainer.sampled import Sampled
from ddptop.trainer.steps import StepTracker


class Records(list[dict[str, Any]]):
    """What the hooks emitted, and the tracker that emitted it."""

    tracker: StepTracker

    def steps(self) -> list[dict[str, Any]]:
        """The step records, once the held ones are made (they are built on the sender's thread: steps.py)."""
        self.tracker.flush()
        return [r for r in self if r["type"] == "step"]


@contextlib.contextmanager
def installed(policy: GuardPolicy, sampled: Sampled | None = None) -> Iterator[Records]:
    """The hooks, with policy (and the rank's sampled readings, where given), until the block
    ends; then torch as it was (patches.undo)."""
    out = Records()
    out.tracker = StepTracker(0, emit=out.append)
    hooks.install(out.tracker, policy, sampled)
    try:
        yield out
    finally:
        out.tracker.flush()
        patches.undo()
