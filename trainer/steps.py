"""Turning hook callbacks into one record per training step, and the phase.

The hooks (hooks.py) only tell this tracker what just happened: a forward
began or ended, the optimizer step began or ended, the script called
monitor.step(). The tracker owns the step boundaries and the record:

- a step ends when the optimizer's step() returns; its step time runs from
  the end of the previous step, so it includes the data wait;
- data wait is the time from the end of one step to the next step's first
  forward;
- samples is the batch dimension of the DDP forward input, summed over the
  forwards of the step (gradient accumulation), unless the script says;
- tokens, the elements of the forward's token ids (hooks.py finds them),
  summed the same way; loss, the sum of what the script called backward()
  on during the step (hooks.py), unless the script says;
- a finished record is held until the next forward so that a monitor.step()
  after optimizer.step() (the usual place) can still add the loss to it.

Values that live on the GPU arrive as Late objects; a record leaves only
when all of its values can be read without waiting (a step late, usually).
No torch here: the tracker is plain Python and tested as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ddptop.core import wire
from ddptop.trainer import late

MAX_WAITING = 8
"""Records whose GPU values are not readable yet; past that the oldest goes
without them rather than waiting."""


class StepTracker:
    def __init__(self, rank: int, emit: Callable[[wire.Frame], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.rank = rank
        self.phase = "startup"
        """Where the rank is in its step, for the heartbeat; the hooks set "backward" (a
        training forward returned) and "comm" (a bucket's all-reduce began) themselves."""
        self.step = 0
        """The step in progress: one past the last step finished, which the heartbeat tells
        the supervisor while that step's record is still held."""
        self.forwards = 0
        """The DDP model's forwards so far, evaluation's too: counted by the forward hook,
        and sent with each heartbeat, so a rank that evaluates is seen to be working."""
        self.total_steps: int | None = None
        self._emit = emit
        self._clock = clock
        self._last_end: float | None = None
        self._first_forward: float | None = None
        self._samples = 0
        self._tokens = 0
        self._loss: Any = None
        """The step's backward() values so far: a float, or a tensor, read only as its record leaves."""
        self._values: dict[str, Any] = {}
        """What the hooks and the script gave the step in progress: plain values, and Late ones."""
        self._optimizer_seen = False
        self._finished: wire.Frame | None = None
        """The record of the step just closed, held for a monitor.step() after optimizer.step()."""
        self._finished_loss: Any = None
        """Its loss, unread: what backward() was called on, until a monitor.step(loss=...) says otherwise."""
        self._given_loss: Any = None
        """A loss monitor.step() gave the step in progress, unread."""
        self._waiting: list[tuple[wire.Frame, dict[str, late.Late]]] = []

    def forward_begin(self, samples: int | None, tokens: int | None = None) -> None:
        now = self._clock()
        if self._finished is not None or self._waiting:
            self._release_finished()
        if self._first_forward is None:
            self._first_forward = now
        if samples:
            self._samples += samples
        if tokens:
            self._tokens += tokens
        self.phase = "forward"

    def in_step(self) -> bool:
        """Whether a training forward ran since the last step ended: a backward now is the step's."""
        return self._first_forward is not None

    def backward_value(self, value: Any) -> None:
        """What backward() was called on: a float, or a tensor, left unread until the record leaves."""
        self._loss = value if self._loss is None else late.add(self._loss, value)

    def optimizer_begin(self, values: dict[str, Any]) -> None:
        """Values measured before the optimizer runs (the pre-clip grad norm)."""
        self.phase = "optimizer"
        if values:
            self._values.update(values)

    def optimizer_end(self, values: dict[str, Any]) -> None:
        """Close the step; values holds what the hooks measured after it (comm, memory)."""
        self._optimizer_seen = True
        if values:
            self._values.update(values)
        self._close_step()

    def scaler_skip(self, values: dict[str, Any]) -> None:
        """GradScaler found inf/nan and did not call optimizer.step(): the step ends anyway."""
        self.optimizer_end({**values, "skipped": "scaler"})

    def explicit(self, loss: Any, samples: int | None, tokens: int | None) -> None:
        """monitor.step(): exact values for the step just finished or in progress.

        They override what the hooks counted (samples from the batch dimension).
        """
        finished = self._finished
        values = self._values if finished is None else finished
        if samples is not None:
            values["samples"] = samples
        if tokens is not None:
            values["tokens"] = tokens
        if finished is not None:
            if loss is not None:
                self._finished_loss = loss
            self._release_finished()
            return
        if loss is not None:
            self._given_loss = loss
        if not self._optimizer_seen:  # no torch.optim step marks the boundary, so this call does
            self._close_step()
            self._release_finished()

    def resumed_at(self, step: int) -> None:
        """The script goes on from a checkpoint: its next step is `step`, and so is ours."""
        self.step = step

    def event(self, record: wire.Frame) -> None:
        """A record outside the step cycle (a checkpoint written, a resume): sent now."""
        self._emit(record)

    def flush(self) -> None:
        """Send everything still held; at exit, when waiting no longer matters."""
        self._release_finished()
        self._waiting, waiting = [], self._waiting
        for record, lates in waiting:
            self._emit(_resolve(record, lates, wait=True))

    def _close_step(self) -> None:
        if self._finished is not None:  # two optimizers stepped with no forward between: both steps are sent
            self._release_finished()
        now = self._clock()
        start = self._last_end if self._last_end is not None else self._first_forward
        record: wire.Frame = {
            "type": "step",
            "rank": self.rank,
            "step": self.step,
            "wall": time.time(),
            "step_ms": (now - start) * 1000.0 if start is not None else 0.0,
        }
        if self._last_end is not None and self._first_forward is not None:
            record["data_ms"] = max(0.0, (self._first_forward - self._last_end) * 1000.0)
        if self._samples:
            record["samples"] = self._samples
        if self._tokens:
            record["tokens"] = self._tokens
        if self.total_steps is not None:
            record["total_steps"] = self.total_steps
        record.update(self._values)
        self._finished = record
        self._finished_loss = self._loss if self._given_loss is None else self._given_loss
        self._given_loss = None
        self._values = {}
        self._samples = 0
        self._tokens = 0
        self._loss = None
        self._first_forward = None
        self._last_end = now
        self.step += 1
        self.phase = "data"

    def _release_finished(self) -> None:
        """Send the held record, and those before it whose GPU values can now be read without waiting."""
        if self._finished is not None:
            record, loss = self._finished, self._finished_loss
            self._finished = self._finished_loss = None
            if loss is not None:
                record["loss"] = late.scalar(loss)
            if not self._waiting and _PLAIN.issuperset(map(type, record.values())):
                self._emit(record)  # the CPU case: every value a number already
                return
            self._waiting.append(_split(record))
        while self._waiting:
            head, lates = self._waiting[0]
            force = len(self._waiting) > MAX_WAITING
            if not force and not all(v.ready() for v in lates.values()):
                break
            self._waiting.pop(0)
            self._emit(_resolve(head, lates, wait=False))


_PLAIN = frozenset((int, float, bool, str))
"""The types of a record value that is read already (None is not: it leaves its field out)."""


def _split(record: wire.Frame) -> tuple[wire.Frame, dict[str, late.Late]]:
    """The record without its Late values and unknowns (None), and its Late values."""
    lates: dict[str, late.Late] = {}
    for key, value in list(record.items()):
        if value is None:
            del record[key]
        elif type(value) not in _PLAIN and late.is_late(value):
            lates[key] = record.pop(key)
    return record, lates


def _resolve(record: wire.Frame, lates: dict[str, late.Late], wait: bool) -> wire.Frame:
    """The record with its Late values read; those not ready, or read as None,
    are left out (unless wait: then every one is read)."""
    for key, value in lates.items():
        if wait or value.ready():
            got = value.get()
            if got is not None:
                record[key] = got
    return record
