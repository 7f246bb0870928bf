"""NaN/Inf: a step whose loss or gradients were non-finite on some rank.

Each rank's guard (trainer/guard.py) checks the global grad norm before the
optimizer steps. After DDP's all-reduce a non-finite gradient is on every
rank, so which rank it came from is what each rank's own loss says: a rank
whose loss was non-finite is named. Gradients that overflow in backward
from a finite loss name no rank (only a comm hook on every bucket could,
at a cost every step that ddptop does not pay).

A step a NaN reached the weights in (one the policy or the device could not
skip) leaves every step after it non-finite: such a run of consecutive steps
is one alert, told again at its 10th step, its 100th and so on, not one a step.

The words a user reads are constants here, so the tests that look for them
use the same ones.
"""

from __future__ import annotations

from typing import Any

from ddptop.core.model.job import JobState
from ddptop.core.policy import WatchPolicy
from ddptop.core.wire import records
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.rules.per_step import PerStepRule
from ddptop.supervisor.watching.verdict import Verdict, ranks_text

ALERT = "non-finite loss or gradients at step {step}: {source}; {handling}"
OWN_LOSS = "{ranks}'s own loss was non-finite"
ALONE = "the loss or gradients were non-finite"
UNKNOWN = "the gradients were non-finite"
FINITE_LOSSES = "every rank's loss was finite: the gradients went non-finite in backward or the all-reduce"
SKIPPED = "step skipped"
SKIPPED_ALL = "step skipped on all ranks"
SKIPPED_ON = "step skipped on {ranks}"
APPLIED_LATE = "applied: a GPU rank whose optimizer takes no found_inf reads this check a step late (--on-nan skip skips such steps)"
APPLIED_ANYWAY = "applied anyway (--on-nan {policy})"
APPLIED_SHARDED = "applied: the gradients are sharded over ranks, and a rank does not skip a step alone"
THEN = {"restart": "; restarting the group", "stop": "; stopping the job"}
IN_A_ROW = "; {count} non-finite steps in a row since step {first}"


class NanRule(PerStepRule):
    def __init__(self, policy: WatchPolicy, state: JobState, liveness: Liveness) -> None:
        super().__init__(state, liveness)
        self.policy = policy
        self._run: tuple[int, int] | None = None
        """The first and last step of the latest run of consecutive non-finite steps."""

    def value(self, record: records.Step) -> Any:
        """(its own loss was non-finite, it skipped the step, its gradients were sharded), for a non-finite step."""
        if not record.get("nonfinite"):
            return None
        return record.get("local_nonfinite"), record.get("skipped") == "nan", bool(record.get("sharded"))

    def judge(self, step: int, values: dict[int, tuple[bool | None, bool, bool]]) -> Verdict | None:
        first = self._run[0] if self._run is not None and step == self._run[1] + 1 else step
        self._run = (first, step)
        count = step - first + 1
        # Weights a non-finite step reached stay so: the steps after it are one alert's, told again at 10, 100...
        if count > 1 and not _power_of_ten(count):
            return None
        named = sorted(r for r, (bad, _, _) in values.items() if bad)
        alone = self.state.world_size == 1
        if alone:
            source = ALONE
        elif named:
            source = OWN_LOSS.format(ranks=ranks_text(named))
        elif all(bad is None for bad, _, _ in values.values()):
            source = UNKNOWN
        else:
            source = FINITE_LOSSES
        then = THEN.get(self.policy.on_nan, "")
        if all(skipped for _, skipped, _ in values.values()):
            # Ranks whose gradients stayed finite skipped nothing: DDP over part of the job
            # (a pipeline stage's replicas), or records not in yet.
            if alone:
                handling = SKIPPED + then
            elif len(values) >= self.state.world_size:
                handling = SKIPPED_ALL + then
            else:
                handling = SKIPPED_ON.format(ranks=ranks_text(sorted(values))) + then
        elif any(sharded for _, _, sharded in values.values()):
            handling = APPLIED_SHARDED + then
        elif self.policy.on_nan == "auto":
            handling = APPLIED_LATE
        else:
            handling = APPLIED_ANYWAY.format(policy=self.policy.on_nan) + then
        text = ALERT.format(step=step, source=source, handling=handling)
        if count > 1:
            text += IN_A_ROW.format(count=count, first=first)
        return Verdict("nan", text, ranks=named, step=step)


def _power_of_ten(count: int) -> bool:
    while count % 10 == 0:
        count //= 10
    return count == 1
