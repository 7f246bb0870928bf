"""The watchdog: the rules (rules/) over every record, and the policy's action on each verdict.

Fed every record the supervisor logs (`observe`) and ticked about four
times a second (`tick`), it returns verdicts; the supervisor (supervise.py)
records them as alerts and carries out their actions. It never touches a
process or a file itself, so every rule is tested with plain records.
What each rule sees and says is its own module's; what is done about it is
core/policy.py's, in one place.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddptop.core import wire
from ddptop.core.model.job import JobState
from ddptop.core.policy import WatchPolicy
from ddptop.core.wire import records
from ddptop.supervisor.watching.failures import LogTail
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.rules import Rule
from ddptop.supervisor.watching.rules.crash import CrashRule
from ddptop.supervisor.watching.rules.desync import DesyncRule
from ddptop.supervisor.watching.rules.hang import HangRule
from ddptop.supervisor.watching.rules.nan import NanRule
from ddptop.supervisor.watching.rules.no_progress import NoProgressRule
from ddptop.supervisor.watching.rules.self_started import SelfStartedRule
from ddptop.supervisor.watching.rules.stall import StallRule
from ddptop.supervisor.watching.rules.straggler import StragglerRule
from ddptop.supervisor.watching.verdict import Verdict


class Watchdog:
    def __init__(
        self,
        policy: WatchPolicy,
        state: JobState,
        log_tail: Callable[[records.WorkerFailure], LogTail] = lambda failure: LogTail([]),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.liveness = Liveness()
        self.crashes = CrashRule(policy, state, self.liveness, log_tail, clock)
        self.rules: list[Rule] = [
            NanRule(policy, state, self.liveness),
            DesyncRule(state, self.liveness),
            self.crashes,
            StallRule(policy, state, self.liveness),
            HangRule(policy, state, self.liveness),
            StragglerRule(state),
            SelfStartedRule(policy),
            NoProgressRule(policy, self.liveness),
        ]
        """In the order their verdicts of one tick are given."""
        self._observers: dict[str, list[Rule]] = {}
        for rule in self.rules:
            for kind in rule.observes:
                self._observers.setdefault(kind, []).append(rule)

    def expect_deaths(self, pids: set[int]) -> None:
        """Processes the supervisor kills on purpose: their deaths are not crashes."""
        self.crashes.expect_deaths(pids)

    def expect_group_restart(self, attempt: int | None = None) -> None:
        """An attempt ends (default: the newest a rank said hello in): whatever fails in it is a consequence.

        On one node the killed ranks are all of them; across nodes, the other
        nodes' ranks fail of the broken collective before their torchrun
        restarts them, and those failures are not crashes either. The attempt
        is torchrun's (the probe's count in each failure), not the ranks'
        hellos: a rank of the next attempt may fail before its hello is read.
        """
        self.crashes.end_attempt(self.liveness.newest_attempt() if attempt is None else attempt)

    def judging(self) -> bool:
        """Whether failures are still gathered, not yet judged (a crash-loop stop may come)."""
        return self.crashes.judging()

    def observe(self, record: wire.Record) -> list[Verdict]:
        now = self.clock()
        self.liveness.observe(record, now)
        rules = self._observers.get(record["type"])
        return self._decided([v for rule in rules for v in rule.observe(record, now)]) if rules else []

    def tick(self, final: bool = False) -> list[Verdict]:
        """Time-based verdicts; final (the job has ended) judges what is pending now."""
        if final:
            return self._decided([v for rule in self.rules for v in rule.final()])
        now = self.clock()
        return self._decided([v for rule in self.rules for v in rule.tick(now)])

    def _decided(self, verdicts: list[Verdict]) -> list[Verdict]:
        for verdict in verdicts:
            verdict.action = self.policy.action_for(verdict.kind)
        return verdicts
