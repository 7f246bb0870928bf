"""Desync: the parameter checksums of one step differ between ranks that replicate them.

Every --desync-every steps each rank sends a checksum of its parameters'
bits. Ranks are compared with the ranks that hold the same parameters: every
rank in a plain DDP job, and, where DDP replicates over part of the job
(pipeline stages or tensor-parallel shards, each with its own process group),
the ranks of the rank's group, which its record names (`replicas`). In each
group the minority is named, and a divergence is alerted once, not at every
later check that finds the same ranks apart.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ddptop.core.model.job import JobState
from ddptop.core.model.rank import replicas_told
from ddptop.core.wire import records
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.rules.per_step import PerStepRule
from ddptop.supervisor.watching.verdict import Verdict, ranks_text

Replicas = tuple[int, ...] | None
"""The ranks a checksum is compared with; None: every rank's."""


class DesyncRule(PerStepRule):
    def __init__(self, state: JobState, liveness: Liveness) -> None:
        super().__init__(state, liveness)
        self._desynced: dict[Replicas, frozenset[int]] = {}
        """The ranks named in each group's latest divergence."""

    def value(self, record: records.Step) -> Any:
        checksum = record.get("checksum")
        if checksum is None:
            return None
        return checksum, replicas_told(record.get("replicas"))

    def judge(self, step: int, values: dict[int, tuple[int, Replicas]]) -> Verdict | None:
        groups: dict[Replicas, dict[int, int]] = {}
        for rank, (checksum, replicas) in values.items():
            groups.setdefault(replicas, {})[rank] = checksum
        texts: list[str] = []
        named: list[int] = []
        checksums: dict[str, str] = {}
        for replicas, group in sorted(groups.items(), key=lambda item: min(item[1])):
            found = _differ(step, replicas, group)
            if found is None:
                self._desynced.pop(replicas, None)
                continue
            odd, text = found
            if self._desynced.get(replicas) == odd:
                continue  # the same ranks as before: one alert per divergence
            self._desynced[replicas] = odd
            texts.append(text)
            named += odd
            checksums.update({str(r): f"{v:016x}" for r, v in group.items()})
        if not texts:
            return None
        return Verdict("desync", "; ".join(texts), ranks=sorted(named), step=step, details={"checksums": checksums})


def _differ(step: int, replicas: Replicas, values: dict[int, int]) -> tuple[frozenset[int], str] | None:
    """The ranks of one group that differ from its majority (all of them where none is), and
    the words that say so; None where they agree."""
    counts = Counter(values.values())
    if len(counts) == 1:
        return None
    among = "" if replicas is None else f" between the data-parallel {ranks_text(list(replicas))}"
    common, votes = counts.most_common(1)[0]
    if votes * 2 > len(values):
        odd = sorted(r for r, v in values.items() if v != common)
        text = (
            f"parameters differ at step {step}{among}: {ranks_text(odd)} "
            + ", ".join(f"{values[r]:016x}" for r in odd)
            + f"; the other {votes} ranks {common:016x}"
        )
    else:
        odd = sorted(values)
        text = f"parameters differ at step {step}{among}, no majority: " + ", ".join(
            f"rank {r} {v:016x}" for r, v in sorted(values.items())
        )
    return frozenset(odd), text
