"""What the NaN and desync rules share: a value from every rank for one step, then a verdict."""

from __future__ import annotations

from typing import Any

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.core.wire import records
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.verdict import Verdict

GATHER_S = 2.0
"""How long a step's verdict waits for the ranks that have not reported it."""


class _Gather:
    """Per-rank values for one step, complete when every rank has given one."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.values: dict[int, Any] = {}


class PerStepRule:
    """A rule judged per step over every rank's value: subclasses say which value, and the verdict."""

    observes = frozenset({"step"})

    def __init__(self, state: JobState, liveness: Liveness) -> None:
        self.state = state
        self.liveness = liveness
        self._pending: dict[tuple[int, int], _Gather] = {}
        """(attempt, step) -> the values gathered so far."""

    def value(self, record: records.Step) -> Any:
        """The value a step record gives this rule; None: it gives none."""
        raise NotImplementedError

    def judge(self, step: int, values: dict[int, Any]) -> Verdict | None:
        raise NotImplementedError

    def observe(self, record: wire.Record, now: float) -> list[Verdict]:
        if record["type"] != "step" or (value := self.value(record)) is None:
            return []
        rank = record["rank"]
        key = (self.liveness.attempt.get(rank, 0), record["step"])
        self._pending.setdefault(key, _Gather(now)).values[rank] = value
        # Only a record that joined a gather can complete one; tick judges those that time out.
        return self.tick(now)

    def tick(self, now: float) -> list[Verdict]:
        world = self.state.world_size
        verdicts = []
        for key in [k for k, g in self._pending.items() if len(g.values) >= world or now - g.since > GATHER_S]:
            verdict = self.judge(key[1], self._pending.pop(key).values)
            if verdict is not None:
                verdicts.append(verdict)
        return verdicts

    def final(self) -> list[Verdict]:
        return self.tick(float("inf"))
