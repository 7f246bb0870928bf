"""Self-started ranks: what is said of a script that starts its own ranks (launch style spawn).

Its ranks are whatever processes it starts that call init_process_group
(trainer/spawned.py), so two things can go wrong that torchrun rules out:
a world size other than the GPUs ddptop gave it, and no rank at all (the
children never join a process group). Both are notices, said once: the
first when the first rank says hello, the second after NO_RANK_S without
one and again if the job ends without one, rather than a hang much later.
"""

from __future__ import annotations

from ddptop.core import wire
from ddptop.core.policy import WatchPolicy
from ddptop.supervisor.watching.verdict import Verdict

NO_RANK_S = 60.0
"""Time a self-starting script has to start a rank before it is said that none came."""


class SelfStartedRule:
    observes = frozenset({"rank_hello"})

    def __init__(self, policy: WatchPolicy) -> None:
        self.started = policy.started
        self._since: float | None = None
        self._ranks = 0
        self._said_none = False
        self._said_world = False

    def observe(self, record: wire.Record, now: float) -> list[Verdict]:
        if record["type"] != "rank_hello":
            return []
        self._ranks += 1
        world, gpus = record["world_size"], self.started.gpus
        if self.started.style != "spawn" or self._said_world or gpus is None or world == gpus:
            return []
        self._said_world = True
        text = f"{self.started.script} runs {world} rank{'s' if world != 1 else ''} but was given {gpus} GPU{'s' if gpus != 1 else ''} (--gpus {gpus})"
        return [Verdict("world-size", text, notice=True)]

    def tick(self, now: float) -> list[Verdict]:
        if self.started.style != "spawn" or self._ranks or self._said_none:
            return []
        self._since = now if self._since is None else self._since
        if now - self._since < NO_RANK_S:
            return []
        self._said_none = True
        return [
            Verdict(
                "no-ranks",
                f"no process {self.started.script} started has called init_process_group in {NO_RANK_S:.0f} s: no rank to watch yet",
                notice=True,
            )
        ]

    def final(self) -> list[Verdict]:
        if self.started.style != "spawn" or self._ranks:
            return []
        text = (
            f"{self.started.script} ended and no process it started called init_process_group: it ran with no rank, so nothing was watched"
        )
        return [Verdict("no-ranks", text, notice=True)]
