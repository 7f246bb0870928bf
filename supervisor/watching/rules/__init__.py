"""The watchdog's rules, one unit each: what each sees in the records, and the verdict it gives.

| rule       | seen from                                             | action (core/policy.py) |
|------------|-------------------------------------------------------|--------------------|
| nan        | step records marked non-finite (the ranks' guard.py)  | --on-nan           |
| desync     | parameter checksums of one step that differ           | --on-desync        |
| stall      | no step, every rank still, for a pace-derived window  | stacks, alert only |
| pause      | no step, some rank still working (a notice, no alert) | none               |
| hang       | no step, every rank still, for --hang-timeout         | stacks, --on-hang  |
| straggler  | a rank's own work per step over STRAGGLER_ALERT x     | alert only         |
| crash      | torchrun's worker_failure records (its probe)         | torchrun restarts  |
| crash-loop | the same crash --crash-loop times in the window       | stop               |
| no-progress | --no-progress attempts in a row that got no further  | stop               |
| world-size, no-ranks | a self-starting script's ranks (hellos) | a notice           |

A rule never touches a process or a file: it reads records (and the job
state the records were folded into) and returns verdicts, so every rule is
tested with plain records.
"""

from __future__ import annotations

from typing import Protocol

from ddptop.core import wire
from ddptop.supervisor.watching.verdict import Verdict


class Rule(Protocol):
    observes: frozenset[str]
    """The record types observe() is given: at 10,000 records a second, no rule sees what it ignores."""

    def observe(self, record: wire.Record, now: float) -> list[Verdict]:
        """Verdicts a record completes (most records complete none)."""
        ...

    def tick(self, now: float) -> list[Verdict]:
        """Verdicts that time completes: a window that passed, a gather that waited long enough."""
        ...

    def final(self) -> list[Verdict]:
        """The job has ended: judge whatever is pending now."""
        ...
