"""A watchdog verdict, and how it is recorded as an `alert`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from ddptop.core.policy import Action
from ddptop.core.wire import records

Kind = Literal["nan", "desync", "stall", "pause", "hang", "straggler", "crash", "crash-loop", "no-progress", "world-size", "no-ranks"]
"""What a rule found; an alert record's `kind` (a pause, a world size and no ranks are notices)."""


@dataclass
class Verdict:
    kind: Kind
    text: str
    action: Action = "none"
    """none, restart (the group) or stop (the job): set from the policy (core/policy.py)."""
    ranks: list[int] = field(default_factory=list)
    step: int | None = None
    stacks: list[int] = field(default_factory=list)
    """Ranks whose Python stacks to collect before acting."""
    details: dict[str, Any] = field(default_factory=dict)
    notice: bool = False
    """What the watchdog saw and explains, but does not alert on (a pause between steps)."""

    def record(self) -> records.Alert | records.Notice:
        if self.notice:
            return {"type": "notice", "wall": time.time(), "text": self.text, "kind": self.kind}
        # details are the kind's own fields, each declared in Alert: no literal mypy could check.
        return cast(
            records.Alert,
            {
                "type": "alert",
                "wall": time.time(),
                "kind": self.kind,
                "rank": self.ranks[0] if len(self.ranks) == 1 else None,
                "ranks": self.ranks,
                "step": self.step,
                "text": self.text,
                "action": self.action,
                **self.details,
            },
        )


def ranks_text(ranks: list[int]) -> str:
    """ "rank 3" or "ranks 0,1,2", as verdicts name them."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, sorted(ranks)))
