"""Desync: the parameter checksums of one step differ between ranks.

Every --desync-every steps each rank sends a checksum of its parameters'
bits; the minority is named, and a divergence is alerted once, not at every
later check that finds the same ranks apart.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.rules.per_step import PerStepRule
from ddptop.supervisor.watching.verdict import Verdict, ranks_text


class DesyncRule(PerStepRule):
    def __init__(self, state: JobState, liveness: Liveness) -> None:
        super().__init__(state, liveness)
        self._desynced: frozenset[int] = frozenset()

    def value(self, record: wire.Frame) -> Any:
        return record.get("checksum")

    def judge(self, step: int, values: dict[int, int]) -> Verdict | None:
        counts = Counter(values.values())
        if len(counts) == 1:
            self._desynced = frozenset()
            return None
        common, votes = counts.most_common(1)[0]
        if votes * 2 > len(values):
            odd = sorted(r for r, v in values.items() if v != common)
            text = (
                f"parameters differ at step {step}: {ranks_text(odd)} "
                + ", ".join(f"{values[r]:016x}" for r in odd)
                + f"; the other {votes} ranks {common:016x}"
            )
        else:
            odd = sorted(values)
            text = f"parameters differ at step {step}, no majority: " + ", ".join(f"rank {r} {v:016x}" for r, v in sorted(values.items()))
        if frozenset(odd) == self._desynced:
            return None  # the same ranks as before: one alert per divergence
        self._desynced = frozenset(odd)
        return Verdict("desync", text, ranks=odd, step=step, details={"checksums": {str(r): f"{v:016x}" for r, v in values.items()}})
