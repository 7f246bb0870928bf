"""Profiler captures of ranks (`ddptop profile`, the dashboard's P): asked of the ranks, tracked until each answers.

A capture is asked of the chosen ranks over their own connections (a
`rank_command` each; another node's ranks through that node's supervisor),
and said to everyone as a `capture` record: started, refused (one line that
says why), done (each rank's answer in). A rank answers with a `profile`
record (trainer/profiling.py), its trace and summary or why it has none; a
rank that restarts or goes before it answers, or that has not answered
within WAIT_S, is said to have none. One capture at a time: a second one
asked for meanwhile is refused.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.core.wire import records
from ddptop.core.wire.records import asked_ranks
from ddptop.supervisor.watching.verdict import ranks_text
from ddptop.trainer.profiling import MAX_S, MAX_STEPS

DEFAULT_STEPS = 10
WAIT_S = MAX_S + 120.0
"""Longest a capture waits for its ranks: the capture's own bound, then writing the trace."""

Tell = Callable[[int, records.RankCommand], bool]
"""Sends a frame to one of this node's ranks; False when it is not connected."""


@dataclass
class InFlight:
    id: str
    steps: int
    ranks: list[int]
    deadline: float
    attempts: dict[int, int]
    """rank -> the attempt it was asked in: a rank that says hello again restarted."""
    answers: dict[int, str] = field(default_factory=dict)
    """rank -> what became of its capture, in a few words."""


class Captures:
    def __init__(
        self,
        record: Callable[[wire.Record], None],
        tell_rank: Tell,
        forward: Callable[[int, records.Command], bool],
        owner: Callable[[int], int | None],
        folder: Path,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._record, self._tell_rank, self._forward, self._owner = record, tell_rank, forward, owner
        self.folder = folder
        self._clock = clock
        self._numbers = itertools.count(1)
        self.flying: InFlight | None = None

    def ask(self, command: records.Command, state: JobState) -> None:
        """A viewer's request (ranks, or one rank, or none for all; steps), or the aggregator's
        for this node's ranks (it carries the capture's id: only asked, not tracked here)."""
        if command.get("id"):
            for rank in command.get("ranks") or []:
                self._tell(str(command["id"]), rank, int(command.get("steps") or DEFAULT_STEPS), int(command.get("from_step", 0)))
            return
        capture_id = f"{time.strftime('%H%M%S')}-{next(self._numbers)}"
        steps = command.get("steps", DEFAULT_STEPS)
        live = sorted(rank for rank, r in state.ranks.items() if not r.exited)
        asked = asked_ranks(command, live)
        missing = sorted(set(asked) - set(live))
        if self.flying is not None:
            why = f"a capture of {ranks_text(self.flying.ranks)} is under way (profile {self.flying.id}): one at a time"
        elif not 1 <= steps <= MAX_STEPS:
            why = f"--steps {steps}: from 1 to {MAX_STEPS}"
        elif not live:
            why = "no rank is running yet"
        elif missing:
            why = f"{ranks_text(missing)} {'is' if len(missing) == 1 else 'are'} not running in this job (running: {_span(live)})"
        else:
            why = None
        if why is not None:
            self._record({"type": "capture", "wall": time.time(), "id": capture_id, "state": "refused", "text": f"profile refused: {why}"})
            return
        ranks = sorted(set(asked))
        attempts = {rank: state.ranks[rank].restart for rank in ranks}
        from_step = start_step(state, ranks)
        self.flying = InFlight(capture_id, steps, ranks, self._clock() + WAIT_S, attempts)
        text = f"profile {capture_id}: capturing {steps} steps of {ranks_text(ranks)} from step {from_step} on; traces in {self.folder}"
        self._record(
            {"type": "capture", "wall": time.time(), "id": capture_id, "state": "started", "text": text, "ranks": ranks, "steps": steps}
        )
        for rank in ranks:
            owner = self._owner(rank)
            forwarded: records.Command = {
                "type": "command",
                "action": "profile",
                "ranks": [rank],
                "steps": steps,
                "id": capture_id,
                "from_step": from_step,
            }
            if owner is None:
                if not self._tell(capture_id, rank, steps, from_step):
                    self._answer(rank, "not connected")
            elif not self._forward(owner, forwarded):
                self._answer(rank, f"its node {owner} cannot be reached")

    def observe(self, record: wire.Record) -> None:
        flying = self.flying
        if flying is None:
            return
        if record["type"] == "profile" and record["id"] == flying.id and record["rank"] in flying.attempts:
            self._answer(record["rank"], f"failed: {record['error']}" if "error" in record and "path" not in record else "captured")
        elif record["type"] == "rank_hello" and record["rank"] in flying.attempts and record["restart"] != flying.attempts[record["rank"]]:
            self._answer(record["rank"], "restarted before its capture was done")
        elif record["type"] == "rank_gone" and record["rank"] in flying.attempts:
            self._answer(record["rank"], "went before its capture was done")

    def tick(self) -> None:
        """A capture some rank has not answered by its deadline ends without it."""
        flying = self.flying
        if flying is not None and self._clock() > flying.deadline:
            for rank in flying.ranks:
                if rank not in flying.answers:
                    self._answer(rank, f"no answer within {WAIT_S:.0f} s")

    def _tell(self, capture_id: str, rank: int, steps: int, from_step: int) -> bool:
        frame: records.RankCommand = {
            "type": "rank_command",
            "action": "profile",
            "id": capture_id,
            "steps": steps,
            "folder": str(self.folder),
            "from_step": from_step,
        }
        return self._tell_rank(rank, frame)

    def _answer(self, rank: int, what: str) -> None:
        flying = self.flying
        if flying is None or rank in flying.answers:
            return
        flying.answers[rank] = what
        if len(flying.answers) < len(flying.ranks):
            return
        self.flying = None
        told = "; ".join(f"rank {rank} {flying.answers[rank]}" for rank in flying.ranks)
        self._record(
            {"type": "capture", "wall": time.time(), "id": flying.id, "state": "done", "text": f"profile {flying.id} done: {told}"}
        )


LEAD_S = 0.5
"""How far ahead of the ranks' step a capture starts: time for each to hear of it (a rank
reads what it is sent every 0.1 s, more in a large job)."""


def start_step(state: JobState, ranks: list[int]) -> int:
    """The step the ranks start their capture at: LEAD_S ahead at their pace, 2 steps at least."""
    step_ms = [ms for rank in ranks if (ms := state.ranks[rank].window.mean("step_ms")) is not None]
    lead = 2 if not step_ms else max(2, math.ceil(LEAD_S * 1000 / max(statistics.median(step_ms), 1e-3)))
    return max(state.ranks[rank].step for rank in ranks) + 1 + lead


def _span(ranks: list[int]) -> str:
    """ "0-3", or "0,2,5" where they are not consecutive."""
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))
