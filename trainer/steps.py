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
- a monitor.step() after optimizer.step() (the usual place) still adds its
  values to the step just finished, until the next forward.

A closed step is kept as its raw facts (a list) and made a record off the
training thread: the sender's thread calls build() before each batch it
sends (sender.py). Code that runs once per step between torch's kernels
runs cold and leaves torch's own code cold after it, so the training
thread only closes a step's facts and seals them (bench/inrank.py,
docs/benchmarks.md). A step's facts stay open to a monitor.step() until
the next training forward (or the next step's close) seals them; only
sealed facts are built, so the thread that builds never races the one that
amends, and a rank whose training stopped (a long evaluation, a hang) has
all its steps but the last sent all the same. A loss stays unread until its
record is built; values that live on the GPU are Late objects, and a record
leaves only when all of its values can be read without waiting (a step
late, usually).
No torch here: the tracker is plain Python and tested as such.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from ddptop.core import wire
from ddptop.trainer import late

MAX_WAITING = 8
"""Records whose GPU values are not readable yet; past that the oldest goes
without them rather than waiting."""

MAX_SEALED = 8192
"""Sealed steps kept unbuilt at most, the oldest dropped (and counted) past it:
the sender's thread builds them every flush interval, so only steps far
faster than any training's (a script calling monitor.step() in a tight
loop) or a rank with no sender keep more."""

# A closed step's facts, by position in its list (a list, not an object: one is made every step).
_STEP, _START, _FIRST, _END, _SAMPLES, _TOKENS, _LOSS, _VALUES, _TOTAL = range(9)


class StepTracker:
    def __init__(self, rank: int, emit: Callable[[wire.Frame], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.rank = rank
        self.phase = "startup"
        """Where the rank is in its step, for the heartbeat; the hooks set "backward" (a
        training forward returned) and "comm" (a bucket's all-reduce began) themselves."""
        self.step = 0
        """The step in progress: one past the last step finished, which the heartbeat tells
        the supervisor while that step's record is still to be sent."""
        self.forwards = 0
        """The DDP model's forwards so far, evaluation's too: counted by the forward hook,
        and sent with each heartbeat, so a rank that evaluates is seen to be working."""
        self.total_steps: int | None = None
        self._emit = emit
        self._clock = clock
        self._last_end: float | None = None
        self.first_forward: float | None = None
        """When the step's first training forward began; None until one has (a backward() then
        is outside any step, and not the step's loss)."""
        self._samples = 0
        self._tokens = 0
        self.losses: list[Any] = []
        """What backward() was called on in this step, as hooks.py hands it over (tensors, or
        floats it read already): the step's loss is their sum, read as its record is built."""
        self._given_loss: Any = None
        """A loss monitor.step() gave the step in progress, unread."""
        self._values: dict[str, Any] = {}
        """What the hooks and the script gave the step in progress: plain values, and Late ones."""
        self._optimizer_seen = False
        self._sealed: collections.deque[list[Any]] = collections.deque(maxlen=MAX_SEALED)
        """Closed steps' facts that nothing adds to any more, not yet made records."""
        self._finished: list[Any] | None = None
        """The facts of the step just closed, while a monitor.step() may still add to them."""
        self.dropped = 0
        """Steps dropped unbuilt past MAX_SEALED; written by the training thread only."""
        self._waiting: list[tuple[wire.Frame, dict[str, late.Late]]] = []
        self._building = threading.Lock()
        """Held while records are built and sent: by the sender's thread, or by the training thread's event() and flush()."""

    def forward_begin(self, samples: int | None, tokens: int | None = None) -> None:
        if self._finished is not None:
            self._seal()
        if self.first_forward is None:
            self.first_forward = self._clock()
        if samples:
            self._samples += samples
        if tokens:
            self._tokens += tokens
        self.phase = "forward"

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
        if finished is not None:
            if loss is not None:
                finished[_LOSS] = _unread(loss)
            if samples is not None:
                finished[_SAMPLES] = samples
            if tokens is not None:
                finished[_TOKENS] = tokens
            return
        if loss is not None:
            self._given_loss = loss
        if samples is not None:
            self._values["samples"] = samples
        if tokens is not None:
            self._values["tokens"] = tokens
        if not self._optimizer_seen:  # no torch.optim step marks the boundary, so this call does
            self._close_step()
            self._seal()

    def resumed_at(self, step: int) -> None:
        """The script goes on from a checkpoint: its next step is `step`, and so is ours."""
        self.step = step

    def event(self, record: wire.Frame) -> None:
        """A record outside the step cycle (a checkpoint written, a resume): sent now,
        after the records of the steps sealed before it (all but the last one, which a
        monitor.step() may still add to)."""
        with self._building:
            self._build_sealed()
            self._emit(record)

    def flush(self) -> None:
        """Send everything still held; at exit, when waiting no longer matters."""
        self._seal()
        with self._building:
            self._build_sealed()
            self._waiting, waiting = [], self._waiting
            for record, lates in waiting:
                self._emit(_resolve(record, lates, wait=True))

    def _close_step(self) -> None:
        given, losses = self._given_loss, self.losses
        loss = _unread(given) if given is not None else late.losses(losses) if losses else None
        now = self._clock()
        fact = [
            self.step,
            self._last_end,
            self.first_forward,
            now,
            self._samples,
            self._tokens,
            loss,
            self._values,
            self.total_steps,
        ]
        if self._finished is not None:  # a step closed before it with no forward between (two optimizers) is done
            self._seal()
        self._finished = fact
        self._values = {}
        self._samples = self._tokens = 0
        self.losses = []
        self._given_loss = self.first_forward = None
        self._last_end = now
        self.step += 1
        self.phase = "data"

    def _seal(self) -> None:
        """Nothing adds to the step just closed any more: it may be built, on any thread."""
        finished, self._finished = self._finished, None
        if finished is not None:
            if len(self._sealed) == MAX_SEALED:  # the append drops the oldest
                self.dropped += 1
            self._sealed.append(finished)

    def build(self) -> None:
        """Make the sealed steps' records and send those whose values can be read
        without waiting: on the sender's thread, before each batch."""
        with self._building:
            self._build_sealed()

    def _build_sealed(self) -> None:
        sealed = self._sealed
        if sealed:
            now, wall_now = self._clock(), time.time()
            for _ in range(len(sealed)):  # those sealed by now: steps sealed meanwhile wait for the next batch
                fact = sealed.popleft()
                record = _record(self.rank, fact, wall_now - (now - fact[_END]))
                if not self._waiting and late.PLAIN.issuperset(map(type, record.values())):  # None is not: it leaves its field out
                    self._emit(record)  # the CPU case: every value a number already
                else:
                    self._waiting.append(_split(record))
        while self._waiting:
            head, lates = self._waiting[0]
            force = len(self._waiting) > MAX_WAITING
            if not force and not all(v.ready() for v in lates.values()):
                break
            self._waiting.pop(0)
            self._emit(_resolve(head, lates, wait=False))


def _unread(loss: Any) -> Any:
    """A loss as kept until its record is built: a GPU tensor starts its copy to the
    host now, on the training thread's stream; anything else is read when built."""
    return late.scalar(loss) if getattr(loss, "is_cuda", False) else loss


def _record(rank: int, fact: list[Any], wall: float) -> wire.Frame:
    """A closed step's record, from its facts."""
    start, first, end = fact[_START], fact[_FIRST], fact[_END]
    began = start if start is not None else first
    record: wire.Frame = {
        "type": "step",
        "rank": rank,
        "step": fact[_STEP],
        "wall": wall,
        "step_ms": (end - began) * 1000.0 if began is not None else 0.0,
    }
    if start is not None and first is not None:
        record["data_ms"] = max(0.0, (first - start) * 1000.0)
    if fact[_SAMPLES]:
        record["samples"] = fact[_SAMPLES]
    if fact[_TOKENS]:
        record["tokens"] = fact[_TOKENS]
    if fact[_TOTAL] is not None:
        record["total_steps"] = fact[_TOTAL]
    record.update(fact[_VALUES])
    if fact[_LOSS] is not None:
        record["loss"] = late.scalar(fact[_LOSS])
    return record


def _split(record: wire.Frame) -> tuple[wire.Frame, dict[str, late.Late]]:
    """The record without its Late values and unknowns (None), and its Late values."""
    lates: dict[str, late.Late] = {}
    for key, value in list(record.items()):
        if value is None:
            del record[key]
        elif late.is_late(value):
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
