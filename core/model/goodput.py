"""Goodput: where a job's wall time went, productive steps against what was lost.

Folded from the records every part already sees (hellos, steps, checkpoints,
the exit), so the supervisor's exit record, the headless last lines, the
dashboard and a replay all split the same time the same way:

- start-up: the run's start to the first step's start;
- restarts: a failed attempt's last step to the next attempt's first step's
  start (the crash, torchrun's restart, the new ranks' start-up and resume),
  less the time the attempt sat stuck: its last step to the last stall or
  hang verdict on it (the hang itself, stalled);
- recomputed: steps an attempt ran again that an earlier one had finished
  (work since the last checkpoint, lost with the failure);
- skipped: steps the NaN guard (or GradScaler) skipped: run, then thrown away;
- stalled: the part of a step beyond STALL_FACTOR x the job's median step
  time and STALL_MIN_S (a data stall, a rank stuck a while);
- paused: the part of a step beyond the job's median step time, in a step
  during which the watchdog told of a pause (a rank working while the others
  wait: rank 0 evaluating alone, a checkpoint being written) and of no stall
  or hang: the job was not stuck, and a line that had just said "rank 1
  waits for rank 0" must not call it stalled; and an evaluation through the
  DDP model that rank 0's step record tells apart (eval_ms), too short for a
  pause to be told;
- productive: the rest of the steps' time; the remainder of the wall time
  (after the last step: shutdown, a final evaluation) is "other", except
  where a stall or hang verdict came after the last step: a job that ends
  stuck (stopped, or out of restarts) spent that tail stalled.

Steps are counted from rank 0's records: DDP holds every rank to its pace.
With the
checkpoints' write time and the failures seen, Young and Daly's interval
sqrt(2 x write time x mean time between failures) is suggested.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ddptop.core import wire
from ddptop.core.format import span
from ddptop.core.model.stats import median
from ddptop.core.wire import records

STALL_FACTOR = 20.0
STALL_MIN_S = 15.0
GOODPUT_TYPES = frozenset({"run", "rank_hello", "step", "checkpoint", "exit", "alert", "notice"})
"""The records the fold reads."""
STUCK_KINDS = frozenset({"stall", "hang"})
"""Verdicts that say the job stopped stepping: the time from its last step on was stalled."""
PARTS = ("productive", "startup", "restarts", "recomputed", "skipped", "stalled", "paused", "other")


TYPICAL_KEPT = 1000
PACE_EVERY = 100
RANK = 0
"""The rank whose steps are counted: DDP's all-reduce holds every rank to the same steps at the
same pace, and rank 0 is in every attempt of every job. One rank's records keep the fold at
10 steps/s whatever the world size (at 1,024 ranks the supervisor sees 10,000 step records a second)."""


@dataclass
class Attempt:
    first_start: float
    last_end: float
    done_before: int
    """The highest step the attempts before this one finished: a step up to it is recomputed."""
    top: int = -1
    stuck_until: float | None = None
    """The last stall or hang verdict after the attempt's latest step: stuck from that step to it."""


@dataclass
class Goodput:
    started: float | None = None
    attempt: int = 0
    """The attempt of rank 0's latest hello."""
    attempts: dict[int, Attempt] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    """Steps' time by part (productive, recomputed, skipped, stalled, paused)."""
    typical: deque[float] = field(default_factory=lambda: deque(maxlen=TYPICAL_KEPT))
    """Recent step times, whose median sets what a stall is."""
    write_ms: list[float] = field(default_factory=list)
    ended: float | None = None
    stuck_at: float | None = None
    """When the last stall or hang verdict came that no step has ended after."""
    paused_at: float | None = None
    """When the first pause notice came that no step has ended after: a later one (rank 0 still
    working once the others ended) can be read before the step that held the pause, and must not
    move the pause past that step's end.

    Both are times, not flags a step clears: a rank sends a step's record once its next
    step begins, so the record of the step before an evaluation or a hang comes after
    the verdict on them."""
    _pace: float | None = None
    """The median of typical, taken anew every PACE_EVERY steps (a sort of a thousand times is not free at 1,000 steps/s),
    and at the 2nd, 4th, ... 64th step before that: the first step alone (torch.compile's, cuDNN's autotuning) can take
    minutes, and taken as the pace it would hide any stall in the next hundred."""
    _steps: int = 0

    def observe(self, record: wire.Record) -> None:
        if record["type"] == "step":
            if record["rank"] == RANK:
                self._step(record)
        elif record["type"] == "run" and self.started is None:
            self.started = record["wall"]
        elif record["type"] == "rank_hello" and record["rank"] == RANK:
            self.attempt = record["restart"]
            self.paused_at = None  # a pause of the attempt before is over
        elif record["type"] == "checkpoint" and record["rank"] == RANK:
            self.write_ms.append(record["write_ms"])
        elif record["type"] == "exit":
            self.ended = record["wall"]
        elif record["type"] == "notice" and record.get("kind") == "pause" and self.paused_at is None:
            self.paused_at = record["wall"]
        elif record["type"] == "alert" and record.get("kind") in STUCK_KINDS:
            self.stuck_at = record["wall"]
            stuck = self.attempts.get(self.attempt)
            if stuck is not None:
                stuck.stuck_until = record["wall"]

    def _step(self, record: records.Step) -> None:
        seconds, end, step = record["step_ms"] / 1000.0, record["wall"], record["step"]
        after_pause = self.paused_at is not None and end >= self.paused_at
        after_stuck = self.stuck_at is not None and end >= self.stuck_at
        over_part = "paused" if after_pause and not after_stuck else "stalled"
        attempt = self.attempts.get(self.attempt)
        if attempt is None:
            done = max((a.top for a in self.attempts.values()), default=-1)
            attempt = self.attempts[self.attempt] = Attempt(end - seconds, end, done)
        attempt.last_end = max(attempt.last_end, end)
        attempt.top = max(attempt.top, step)
        if after_pause:
            self.paused_at = None
        if after_stuck:
            self.stuck_at = attempt.stuck_until = None
        parts = self.seconds
        if record.get("skipped") is not None:
            parts["skipped"] += seconds
        elif step <= attempt.done_before:
            parts["recomputed"] += seconds
        else:
            pace = self._pace or seconds
            # An evaluation the step's record tells apart is paused, however short; one the
            # watchdog told of is in the pause's own part below.
            evaluated = 0.0 if over_part == "paused" else min(seconds, record.get("eval_ms", 0.0) / 1000.0)
            parts["paused"] += evaluated
            rest = seconds - evaluated
            # A pause the watchdog saw is all the step's time beyond the job's pace; a stall, what
            # is beyond the threshold that tells one from a slow step.
            over = pace if over_part == "paused" else max(STALL_MIN_S, STALL_FACTOR * pace)
            lost = rest - over if rest > over else 0.0
            parts[over_part] += lost
            parts["productive"] += rest - lost
        self.typical.append(seconds)
        self._steps += 1
        steps = self._steps
        if steps % PACE_EVERY == 1 or (steps < PACE_EVERY and steps & (steps - 1) == 0):
            self._pace = median(list(self.typical))

    def split(self, now: float | None = None) -> dict[str, Any] | None:
        """Seconds of each part, the wall time, the goodput share, failures and the suggested checkpoint interval."""
        end = self.ended if self.ended is not None else now
        if self.started is None or end is None or end <= self.started:
            return None
        parts = dict(self.seconds)
        previous_end, stuck_until = self.started, None
        for index, number in enumerate(sorted(self.attempts)):
            attempt = self.attempts[number]
            gap = max(0.0, attempt.first_start - previous_end)
            stuck = 0.0 if stuck_until is None else min(gap, max(0.0, stuck_until - previous_end))
            parts["stalled"] += stuck
            parts["startup" if index == 0 else "restarts"] += gap - stuck
            previous_end, stuck_until = attempt.last_end, attempt.stuck_until
        wall = end - self.started
        if not self.attempts:
            parts["startup"] = wall
        elif self.stuck_at is not None:
            parts["stalled"] += max(0.0, end - previous_end)
        # Step times come from the ranks' clocks, the wall time from the supervisor's: where they
        # disagree (records of a job replayed or made up), the steps' parts shrink to fit the wall.
        stepping = ("productive", "recomputed", "skipped", "stalled", "paused")
        excess = sum(parts.values()) - wall
        if excess > 0:
            total = sum(parts[part] for part in stepping)
            for part in stepping:
                parts[part] *= max(0.0, total - excess) / total if total else 0.0
        parts["other"] = max(0.0, wall - sum(v for k, v in parts.items() if k != "other"))
        failures = self.attempt  # each attempt after the first began with a failure (or a restart asked for)
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


SAID = {"other": "after the last step"}
"""A part's words in the line where its key would not say what it is: "other 1.7 s" left the
reader to guess the shutdown (or a final evaluation) it mostly is."""


def text(split: dict[str, Any]) -> str:
    """One line: the share, then where the rest went (only the parts that took time), each in the
    unit it reads best in (a day's run in hours, its start-up in seconds)."""
    lost = ", ".join(f"{SAID.get(part, part)} {span(split[f'{part}_s'])}" for part in PARTS[1:] if split[f"{part}_s"] >= 0.05)
    line = f"goodput {split['goodput']:.0%} of {span(split['wall_s'])}" + (f"; lost: {lost}" if lost else "")
    if "checkpoint_every_s" in split:
        failures = split["failures"]
        line += f"; checkpoint every {span(split['checkpoint_every_s'])} for {failures} failure{'s' if failures != 1 else ''} (Young/Daly)"
    return line
