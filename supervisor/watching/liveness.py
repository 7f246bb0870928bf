"""What the watchdog knows of each rank from its records, that several rules read.

Times are the supervisor's own monotonic clock at arrival, so ranks on
other hosts with skewed clocks cannot fake or hide a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.core import wire


@dataclass
class Liveness:
    attempt: dict[int, int] = field(default_factory=dict)
    """rank -> the restart count of its latest hello."""
    progress: dict[int, float] = field(default_factory=dict)
    """rank -> when it last finished a step (or said hello)."""
    heard: dict[int, float] = field(default_factory=dict)
    """rank -> when it last sent anything."""
    stepped: set[int] = field(default_factory=set)
    """Ranks that finished a step in their current attempt."""
    gone: dict[int, float] = field(default_factory=dict)
    """rank -> when its connection closed."""
    exceptions: dict[int, str] = field(default_factory=dict)
    """rank -> the traceback of the exception it died of, in its current attempt."""

    def observe(self, record: wire.Frame, now: float) -> None:
        kind = record.get("type")
        if kind == "rank_hello":
            rank = record["rank"]
            self.attempt[rank] = record["restart"]
            self.progress[rank] = self.heard[rank] = now
            self.stepped.discard(rank)
            self.exceptions.pop(rank, None)
            self.gone.pop(rank, None)
        elif kind == "step":
            rank = record["rank"]
            self.progress[rank] = self.heard[rank] = now
            self.stepped.add(rank)
        elif kind == "heartbeat":
            self.heard[record["rank"]] = now
        elif kind == "exception":
            self.exceptions[record["rank"]] = record["text"]
        elif kind == "rank_gone":
            self.gone[record["rank"]] = now

    def live(self) -> list[int]:
        """Ranks that said hello and whose connection has not closed since."""
        return [r for r in self.progress if r not in self.gone]

    def newest_attempt(self) -> int:
        return max(self.attempt.values(), default=0)
