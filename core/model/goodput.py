"""Goodput: where a job's wall time went, productive steps against what was lost.

Folded from the records every part already sees (hellos, steps, checkpoints,
the exit), so the supervisor's exit record, the headless last lines, the
dashboard and a replay all split the same time the same way:

- start-up: the run's start to the first step's start;
- restarts: a failed attempt's last step to the next attempt's first step's
  start (the hang or crash, torchrun's restart, the new ranks' start-up and
  resume);
- recomputed: steps an attempt ran again that an earlier one had finished
  (work since the last checkpoint, lost with the failure);
- skipped: steps the NaN guard (or GradScaler) skipped: run, then thrown away;
- stalled: the part of a step beyond STALL_FACTOR x the job's median step
  time and STALL_MIN_S (a data stall, a rank stuck a while);
- productive: the rest of the steps' time; the remainder of the wall time
  (after the last step: shutdown, a final evaluation) is "other".

A step of the job takes as long as its slowest rank: one (attempt, step)
counts once, with the longest time any rank reported for it. With the
checkpoints' write time and the failures seen, Young and Daly's interval
sqrt(2 x write time x mean time between failures) is suggested.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ddptop.core import wire
from ddptop.core.model.stats import median

STALL_FACTOR = 20.0
STALL_MIN_S = 15.0
GOODPUT_TYPES = frozenset({"run", "rank_hello", "step", "checkpoint", "exit"})
"""The records the fold reads."""
PARTS = ("productive", "startup", "restarts", "recomputed", "skipped", "stalled", "other")


SETTLE = 8
"""Steps behind an attempt's newest before a step's slowest rank is taken as known: DDP's
ranks are never that far apart, and the fold keeps only this many steps open."""
TYPICAL_KEPT = 1000


@dataclass
class _Attempt:
    first_start: float
    last_end: float
    done_before: int
    """The highest step the attempts before this one finished: a step up to it is recomputed."""
    top: int = -1
    open: dict[int, tuple[float, float, bool]] = field(default_factory=dict)
    """step -> (end, longest seconds, skipped) while ranks may still report it."""


@dataclass
class Goodput:
    started: float | None = None
    attempt_of: dict[int, int] = field(default_factory=dict)
    """rank -> the attempt of its latest hello."""
    attempts: dict[int, _Attempt] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    """Settled steps' time by part (productive, recomputed, skipped, stalled)."""
    typical: deque[float] = field(default_factory=lambda: deque(maxlen=TYPICAL_KEPT))
    """Recent settled step times, whose median sets what a stall is."""
    write_ms: list[float] = field(default_factory=list)
    ended: float | None = None

    def observe(self, record: wire.Frame) -> None:
        kind = record.get("type")
        if kind == "run" and self.started is None:
            self.started = record.get("wall")
        elif kind == "rank_hello":
            self.attempt_of[record["rank"]] = record["restart"]
        elif kind == "step":
            self._step(self.attempt_of.get(record["rank"], 0), record)
        elif kind == "checkpoint" and record["rank"] == 0:
            self.write_ms.append(record["write_ms"])
        elif kind == "exit":
            self.ended = record["wall"]

    def _step(self, number: int, record: wire.Frame) -> None:
        seconds, end, step = record["step_ms"] / 1000.0, record["wall"], record["step"]
        attempt = self.attempts.get(number)
        if attempt is None:
            done = max((a.top for a in self.attempts.values()), default=-1)
            attempt = self.attempts[number] = _Attempt(end - seconds, end, done)
        attempt.first_start = min(attempt.first_start, end - seconds)
        attempt.last_end = max(attempt.last_end, end)
        old = attempt.open.get(step)
        skipped = record.get("skipped") is not None
        attempt.open[step] = (end, seconds, skipped) if old is None else (max(old[0], end), max(old[1], seconds), old[2] or skipped)
        attempt.top = max(attempt.top, step)
        for settled in [n for n in attempt.open if n <= attempt.top - SETTLE]:
            self._settle(attempt, settled)

    def _settle(self, attempt: _Attempt, step: int) -> None:
        _, seconds, skipped = attempt.open.pop(step)
        self._count(self.seconds, attempt, step, seconds, skipped)
        self.typical.append(seconds)

    def _count(self, parts: dict[str, float], attempt: _Attempt, step: int, seconds: float, skipped: bool) -> None:
        if skipped:
            parts["skipped"] += seconds
        elif step <= attempt.done_before:
            parts["recomputed"] += seconds
        else:
            over = max(STALL_MIN_S, STALL_FACTOR * (median(list(self.typical)) or seconds))
            stalled = seconds - over if seconds > over else 0.0
            parts["stalled"] += stalled
            parts["productive"] += seconds - stalled

    def split(self, now: float | None = None) -> dict[str, Any] | None:
        """Seconds of each part, the wall time, the goodput share, failures and the suggested checkpoint interval."""
        end = self.ended if self.ended is not None else now
        if self.started is None or end is None or end <= self.started:
            return None
        parts = dict(self.seconds)
        for attempt in self.attempts.values():  # open steps count as known so far; they stay open
            for step, (_, seconds, skipped) in attempt.open.items():
                self._count(parts, attempt, step, seconds, skipped)
        previous_end = self.started
        for index, number in enumerate(sorted(self.attempts)):
            attempt = self.attempts[number]
            parts["startup" if index == 0 else "restarts"] += max(0.0, attempt.first_start - previous_end)
            previous_end = attempt.last_end
        wall = end - self.started
        if not self.attempts:
            parts["startup"] = wall
        # Step times come from the ranks' clocks, the wall time from the supervisor's: where they
        # disagree (records of a job replayed or made up), the steps' parts shrink to fit the wall.
        stepping = ("productive", "recomputed", "skipped", "stalled")
        excess = sum(parts.values()) - wall
        if excess > 0:
            total = sum(parts[part] for part in stepping)
            for part in stepping:
                parts[part] *= max(0.0, total - excess) / total if total else 0.0
        parts["other"] = max(0.0, wall - sum(v for k, v in parts.items() if k != "other"))
        failures = max(0, len(self.attempts) - 1)
        result: dict[str, Any] = {
            "wall_s": round(wall, 3),
            **{f"{part}_s": round(seconds, 3) for part, seconds in parts.items()},
            "goodput": round(parts["productive"] / wall, 4),
            "failures": failures,
        }
        if failures and self.write_ms:
            write_s = (median(self.write_ms) or 0.0) / 1000.0
            result["checkpoint_every_s"] = round(math.sqrt(2.0 * write_s * wall / failures), 1)
        return result


def text(split: dict[str, Any]) -> str:
    """One line: the share, then where the rest went (only the parts that took time)."""
    lost = ", ".join(f"{part} {split[f'{part}_s']:.1f} s" for part in PARTS[1:] if split[f"{part}_s"] >= 0.05)
    line = f"goodput {split['goodput']:.0%} of {split['wall_s']:.1f} s" + (f"; lost: {lost}" if lost else "")
    if "checkpoint_every_s" in split:
        line += f"; checkpoint every {split['checkpoint_every_s']:.0f} s for {split['failures']} failure{'s' if split['failures'] != 1 else ''} (Young/Daly)"
    return line
