"""NaN/Inf: a step whose loss or gradients were non-finite on some rank.

Each rank's guard (trainer/guard.py) checks the global grad norm before
the optimizer steps, and its own gradients before the all-reduce, which is
what names the rank a bad value came from.
"""

from __future__ import annotations

from typing import Any

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.policy import WatchPolicy
from ddptop.supervisor.watching.rules.per_step import PerStepRule
from ddptop.supervisor.watching.verdict import Verdict, ranks_text


class NanRule(PerStepRule):
    def __init__(self, policy: WatchPolicy, state: JobState, liveness: Liveness) -> None:
        super().__init__(state, liveness)
        self.policy = policy

    def value(self, record: wire.Frame) -> Any:
        """(its own gradients were non-finite, it skipped the step), for a non-finite step."""
        if not record.get("nonfinite"):
            return None
        return record.get("local_nonfinite"), record.get("skipped") == "nan"

    def judge(self, step: int, values: dict[int, tuple[bool | None, bool]]) -> Verdict:
        named = sorted(r for r, (bad, _) in values.items() if bad)
        if named:
            source = f"{ranks_text(named)}'s own gradients were"
        elif all(bad is None for bad, _ in values.values()):  # no DDP: one process, nothing all-reduced
            source = "the gradients were"
        else:
            source = "no rank's own gradients were seen as"
        then = {"restart": "; restarting the group", "stop": "; stopping the job"}.get(self.policy.on_nan, "")
        if all(skipped for _, skipped in values.values()):
            handling = ("step skipped on all ranks" if self.state.world_size > 1 else "step skipped") + then
        elif self.policy.on_nan == "auto":
            handling = "applied: CUDA ranks read this check a step late instead of waiting for it (--on-nan skip skips such steps)"
        else:
            handling = f"applied anyway (--on-nan {self.policy.on_nan})" + then
        return Verdict("nan", f"non-finite loss or gradients at step {step}: {source} non-finite; {handling}", ranks=named, step=step)
