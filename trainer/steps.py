"""Turning hook callbacks into one record per training step, and the phase.

The training thread only journals what happened (a forward began, the step
closed); the sender's thread reads the journal into step records, sent once
every value can be read without waiting. Why, and how data wait, evaluation,
samples and the loss are counted: docs/design.md, "the step's facts". No
torch here: the tracker is plain Python and tested as such.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any

from ddptop.core import wire
from ddptop.trainer import late, loss, where
from ddptop.trainer.step_comm import COMM_WAIT

MAX_WAITING = 64
"""Records whose GPU values are not readable yet (a device that many steps behind the
host); past that the oldest goes without them rather than waiting."""

SEAL_AFTER_S = 5.0
SEAL_AFTER_STEPS = 2.0
"""A closed step with no training forward since is sent after this many of its own step
times, and at least SEAL_AFTER_S: a monitor.step() for it comes sooner (its .item() of the
loss waits at most for the device to finish the step), and a pause is told after 15 s.
A step whose backward() losses the training thread still holds (no guard packed them)
waits for them: they are taken at the next forward."""

MAX_JOURNAL = 65536
"""Journal entries kept unread at most, the oldest dropped past it: the sender's
thread reads them all every flush interval, so only steps far faster than any
training's (a script calling monitor.step() in a tight loop) or a rank whose
sender is gone keep more. Steps lost so are counted (StepTracker.dropped)."""

LOSSES_KEPT = 1024
"""The most backward() values a step holds for its loss: a loop that no optimizer step (or
monitor.step) closes holds no more."""

STEPS_KEPT = 4096
"""Closed steps whose wall-clock span is kept, to name the step a sampled reading measured: a
reading comes about a second after DDP took it, 4,000 steps later at 0.25 ms a step."""


@dataclass(slots=True)
class StepFacts:
    """A closed step as the journal told it, until its record is made (_seal)."""

    step: int
    start: float | None
    """When the step before it ended, on the clock: its step time and data wait run from there."""
    first: float | None
    """When its first training forward began."""
    end: float
    samples: int
    tokens: int
    loss: Any
    """What monitor.step() gave, or the sum of its backward() values (a number, or a Late)."""
    values: dict[str, Any]
    """What the hooks measured (the guard's pack, the learning rate, sampled timings)."""
    evaluation: tuple[float, float] | None
    """When an evaluation between the step before and its first forward began and ended."""


class StepTracker:
    def __init__(self, rank: int, emit: Callable[[wire.Frame], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.rank = rank
        self.phase = "startup"
        """Where the rank is in its step, for the heartbeat; the backward() wrapper sets "backward"
        as a backward begins (hooks.py), so the loss computed after a forward is still "forward"
        (DDP's all-reduce is inside the backward: the flight recorder tells a rank that waits in
        it, trainer/flightrecorder.py)."""
        self.step = 0
        """The step in progress: one past the last step closed, which the heartbeat tells
        the supervisor while that step's record is still to be sent."""
        self.forwards = 0
        """The DDP model's forwards so far, evaluation's too: counted by the forward hook,
        and sent with each heartbeat, so a rank that evaluates is seen to be working."""
        self.total_steps: int | None = None
        self.replicas: tuple[int, ...] | None = None
        """The ranks this rank is data-parallel with, where that is part of the job
        (Probe.data_parallel_over): they do its work on other samples, and hold the same
        parameters, or shards of them. None: every rank. Sent with each heartbeat and each
        checksum: the desync check compares only those, and the job's samples/s counts each
        sample once."""
        self.batch_shared = 1
        """How many ranks are given this rank's batch: a tensor-parallel group over the whole
        job, with no data parallelism beside it (Probe.batch_shared_by). Sent with each
        heartbeat past 1: the job's samples/s counts the batch once."""
        self.journal: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=MAX_JOURNAL)
        """What happened on the training thread, in order, for the sender's thread to make
        records of (build()): each entry is the reader that takes it, then what it takes
        (a tuple: one is made for every event of every step)."""
        # The readers, bound once: the training thread journals them with no lookup of its own.
        self._forward_read = self._read_forward
        self._values_read = self._read_values
        self._given_read = self._read_given
        self._end_read = self._close
        self._resume_read = self._read_resume
        self._loss_read = self._read_loss
        self._evaluation_read = self._read_evaluation
        self.in_step = False
        """Whether a training forward ran since the last step closed (a backward() before
        one is outside any step, and not the step's loss)."""
        self.began = 0.0
        """When the step's first training forward began, on the clock."""
        self.micro = 0
        """The step's training forwards of its leader so far: more than one where the script
        accumulates gradients over micro-batches (DDP's no_sync), of which DDP times the last."""
        self.leader: int | None = None
        """The id of the model whose training forward began the step in progress: only its
        forwards' batches are the step's samples and tokens. Another model's forward in the
        same step (an encoder's decoder, a GAN's generator feeding its discriminator) is fed
        what the first was fed or made from it, and counting it would count samples twice."""
        self.losses: list[Any] = []
        """What backward() was called on in this step, as hooks.py hands it over (detached
        tensors; a tuple (tensor, True) for one a GradScaler scaled): the guard packs them,
        or, in a step no optimizer closes, their sum is taken once the step has closed (_read_loss)."""
        self.loss_ids: list[int] = []
        """The ids of the script's own tensors behind `losses` (the unscaled one for a scaled
        loss), kept until the next step's first forward: a monitor.step(loss=) of the step's
        one loss tensor needs no copy of its own."""
        self._held: list[Any] | None = None
        """The losses of the step closed last, until the next training forward or close takes
        them (a monitor.step() for that step drops them: its loss wins)."""
        self._loss_given = False
        """Whether monitor.step() gave a loss for the step in progress: its losses are dropped."""
        self.optimizer_seen = False
        """Whether a torch optimizer has closed a step: until one has, monitor.step() does."""
        self.dropped = 0
        """Steps lost unbuilt past MAX_JOURNAL, counted as the journal is read."""
        self._emit = emit
        self._clock = clock
        self._building = threading.Lock()
        """Held while the journal is read and records are sent: by the sender's thread, or
        by the training thread's event() and flush()."""
        # The step being read from the journal (only under _building):
        self._last_end: float | None = None
        self._first: float | None = None
        self._samples = 0
        self._tokens = 0
        self._given_loss: Any = None
        self._values: dict[str, Any] = {}
        self._finished: StepFacts | None = None
        """The facts of the step read closed last, while a monitor.step() may still add to them."""
        self._seal_by = 0.0
        """When it may be sent with no forward after it (SEAL_AFTER_S), on the clock."""
        self._awaits_loss = False
        """Whether its backward() losses are held for the next forward: it waits for them."""
        self._sealed_early = False
        """Whether it was sent so, before a forward: what a monitor.step() gives for it now is dropped."""
        self._wall_offset = 0.0
        """time.time() less the clock, taken as each read begins: a step's wall time is its end plus it."""
        self._next_step = 0
        """The step the next close should be: a gap says entries were lost."""
        self._lost = False
        """Whether the journal was found full: the step read next may have lost entries."""
        self._waiting: list[tuple[wire.Frame, dict[str, late.Late]]] = []
        self._sampled: dict[str, Any] = {}
        """What the sender sampled that no record has taken yet (sampled.py)."""
        self._evaluated: list[float] | None = None
        """When the forwards of an evaluation since the last step closed began and last returned
        (evaluating, evaluated): journaled as the next training forward begins."""
        self._eval: tuple[float, float] | None = None
        """The evaluation read before the step in progress's first forward (_read_evaluation)."""
        self.eval_code: CodeType | None = None
        """The script's function that ran the evaluation since the last step (where.Phase)."""
        self._spans: collections.deque[tuple[int, float, float, int]] = collections.deque(maxlen=STEPS_KEPT)
        """(step, start, end, micro) of the steps closed last, on the clock: where a sampled
        reading falls, and how many micro-batches that step's compute was."""

    def forward_begin(self, samples: int | None, tokens: int | None = None, model: int | None = None) -> None:
        """A training forward of the model whose id is model begins."""
        if self._held is not None:
            self._take_held(self._held)
        if self._evaluated is not None:
            self.journal.append((self._evaluation_read, *self._evaluated))
            self._evaluated = None
        now = self._clock()
        if not self.in_step:  # what backward() was called on before the step's first forward is not its loss
            self.losses, self.loss_ids = [], []
            self.leader = model
            self.began, self.micro = now, 1
        else:
            if model != self.leader:
                samples = tokens = None
            else:
                self.micro += 1
            if len(self.losses) >= LOSSES_KEPT:
                self.losses, self.loss_ids = [], []
        self.in_step = True
        self.journal.append((self._forward_read, now, samples, tokens))
        self.phase = "forward"

    def evaluating(self, began: float | None = None) -> None:
        """A forward that is not training begins between two steps: an evaluation's, which
        began then (on the clock; None: now). Its first also says where the script runs it."""
        now = self._clock()
        if self._evaluated is None:
            self._evaluated = [now if began is None else began, now]
            self.eval_code = where.script_caller()
        self.phase = "eval"

    def evaluated(self) -> None:
        """That forward returned: the evaluation ran until now, so far."""
        if self._evaluated is not None:
            self._evaluated[1] = self._clock()

    def began_wall(self) -> float:
        """When the last step's first training forward began, in Unix seconds: where its data
        wait ends, for a profiler capture's phases (read only while one runs)."""
        return time.time() - (self._clock() - self.began)

    def optimizer_begin(self, values: dict[str, Any]) -> None:
        """Values measured before the optimizer runs (the pre-clip grad norm)."""
        self.phase = "optimizer"
        if values:
            self.journal.append((self._values_read, values))

    def optimizer_end(self, values: dict[str, Any]) -> None:
        """Close the step; values holds what the hooks measured after it (comm, memory).

        Its losses are held, not read: a monitor.step() after optimizer.step(), the usual
        place, gives the step's loss itself, and reading one costs the training thread
        a torch call. What no such call took is read as the next training forward begins.
        They are read on this thread, not the sender's: a tensor held for another thread
        and freed there leaves the training thread's next steps slower (loss.unpacked)."""
        self.optimizer_seen = True
        if self._held is not None:  # two steps closed with no forward between (two optimizers)
            self._take_held(self._held)
        if self._loss_given:
            self._loss_given = False
        elif self.losses:
            self._held = self.losses
        self.losses = []
        self.journal.append((self._end_read, self._clock(), self.step, values, self.micro, self._held is not None))
        self.in_step = False
        self.step += 1
        self.phase = "data"

    def scaler_skip(self, values: dict[str, Any]) -> None:
        """GradScaler found inf/nan and did not call optimizer.step(): the step ends anyway."""
        self.optimizer_end({**values, "skipped": "scaler"})

    def explicit(self, loss: Any, samples: int | None, tokens: int | None) -> None:
        """monitor.step(): exact values for the step just finished or in progress.

        They override what the hooks counted (samples from the batch dimension). A loss
        that is not a number or a one-element tensor raises ValueError here, in the
        script's call, rather than on the sender's thread.
        """
        if loss is not None and self.loss_ids == [id(loss)]:
            loss = None  # the step's one backward() loss: the guard's pack carries it, read or on its way
        if loss is not None:  # it wins over what backward() was called on, in the step it speaks for
            try:  # a CPU tensor is read now (loss.unpacked says why); a GPU one's copy to the host starts
                loss = late.scalar(loss)
            except (RuntimeError, TypeError, ValueError) as exc:
                raise ValueError(f"monitor.step(loss=...) takes a number or a one-element tensor ({exc})") from None
            if self.in_step or not self.optimizer_seen:
                self._loss_given = True
            else:
                self._held = None
        if self.optimizer_seen:
            self.journal.append((self._given_read, loss, samples, tokens, False))
            return
        self.journal.append((self._given_read, loss, samples, tokens, True))  # no torch.optim step marks the boundary, so this call does
        self.optimizer_end({})
        self.optimizer_seen = False

    def resumed_at(self, step: int) -> None:
        """The script goes on from a checkpoint: its next step is `step`, and so is ours."""
        self.step = step
        self.journal.append((self._resume_read, step))

    def event(self, record: wire.Frame) -> None:
        """A record outside the step cycle (a checkpoint written, a resume): sent now,
        after the records of the steps closed before it (all but the last one, which a
        monitor.step() may still add to)."""
        with self._building:
            self._read()
            self._emit(record)

    def flush(self, sampled: dict[str, Any] | None = None) -> None:
        """Send everything still held; at exit, when waiting no longer matters. On the
        training thread, which alone takes the held losses. sampled: as build() takes it."""
        if self._held is not None:
            self._take_held(self._held)
        with self._building:
            if sampled:
                self._sampled.update(sampled)
            self._read()
            self._seal()
            self._waiting, waiting = [], self._waiting
            for record, lates in waiting:
                self._emit(_resolve(record, lates, wait=True))

    def build(self, sampled: dict[str, Any] | None = None) -> None:
        """Read the journal, make the records of the steps nothing adds to any more, and
        send those whose values can be read without waiting: on the sender's thread,
        before each batch. sampled: what the sender read since (sampled.py), for the
        next record made."""
        with self._building:
            if sampled:
                self._sampled.update(sampled)
            self._read()
            if self._finished is not None and not self._awaits_loss and self._clock() >= self._seal_by:
                self._seal()
                self._sealed_early = True
            self._send_ready()

    def _take_held(self, held: list[Any]) -> None:
        """Journal the held losses of the step closed last, summed (on the training thread)."""
        self._held = None
        self.journal.append((self._loss_read, loss.unpacked(held)))

    def _read(self) -> None:
        """Turn the journal's entries so far into steps: entries appended meanwhile wait
        for the next read."""
        journal = self.journal
        self._wall_offset = time.time() - self._clock()
        if len(journal) == journal.maxlen:  # full: the oldest entries may be lost, the first step read with them
            self._lost = True
        for _ in range(len(journal)):
            entry = journal.popleft()
            entry[0](*entry[1:])

    def _read_forward(self, began: float, samples: int | None, tokens: int | None) -> None:
        """A training forward began: the step it begins (or adds to) takes its batch."""
        self._sealed_early = False
        if self._finished is not None:
            self._seal()
        if self._first is None:
            self._first = began
        if samples:
            self._samples += samples
        if tokens:
            self._tokens += tokens

    def _read_values(self, values: dict[str, Any]) -> None:
        """What the hooks measured before the optimizer ran (the guard's pack)."""
        self._values.update(values)

    def _read_given(self, loss: Any, samples: int | None, tokens: int | None, closes: bool) -> None:
        """What monitor.step() said, for the step just closed if no training forward came since,
        else for the step in progress; `closes` when no torch optimizer marks the steps, so the
        call ends the step it speaks for (an end follows)."""
        if closes and self._finished is not None:  # it speaks for the step it closes, not the one before
            self._seal()
        if closes or not self._sealed_early:  # else it speaks for a step sent already
            self._given(loss, samples, tokens)

    def _read_resume(self, step: int) -> None:
        """The script went on from a checkpoint, so steps jump to `step`."""
        self._next_step = step

    def _read_loss(self, loss: Any) -> None:
        """The sum of what backward() was called on during the step closed last, where the guard
        did not pack it (a step no torch optimizer closed): read, or on its way from a GPU; None
        when none was a loss. Taken as the next training forward begins, or the next step closes,
        unless monitor.step() gave that step's loss."""
        if self._finished is not None:
            self._finished.loss = loss

    def _read_evaluation(self, began: float, ended: float) -> None:
        """The forwards of an evaluation ran from began to ended, after the step closed last and
        before the training forward that begins the next (journaled with it)."""
        self._eval = (began, ended)

    def _given(self, loss: Any, samples: int | None, tokens: int | None) -> None:
        finished = self._finished
        if finished is not None:
            if loss is not None:
                finished.loss = loss
            if samples is not None:
                finished.samples = samples
            if tokens is not None:
                finished.tokens = tokens
            return
        if loss is not None:
            self._given_loss = loss
        if samples is not None:
            self._values["samples"] = samples
        if tokens is not None:
            self._values["tokens"] = tokens

    def _close(self, end: float, step: int, values: dict[str, Any], micro: int, held: bool) -> None:
        """The step closed: values is what the hooks measured after the optimizer (comm, memory,
        the learning rate); micro, its leader's training forwards; held, whether its backward()
        losses wait for the next forward (_read_loss)."""
        self._sealed_early = False
        if self._finished is not None:  # a step closed before it with no forward between (two optimizers) is done
            self._seal()
        expected, self._next_step = self._next_step, step + 1
        if self._lost or step != expected:  # entries lost past MAX_JOURNAL: the steps between, and this one's first
            self.dropped += max(0, step - expected) + 1
            self._lost = False
        else:
            self._finished = StepFacts(
                step, self._last_end, self._first, end, self._samples, self._tokens, self._given_loss, self._values, self._eval
            )
            if values:
                self._values.update(values)
            begun = self._last_end if self._last_end is not None else self._first
            self._spans.append((step, end if begun is None else begun, end, micro))
            took = 0.0 if begun is None else end - begun
            self._seal_by, self._awaits_loss = end + max(SEAL_AFTER_S, SEAL_AFTER_STEPS * took), held
        self._values = {}
        self._samples = self._tokens = 0
        self._given_loss = self._first = self._eval = None
        self._last_end = end

    def _seal(self) -> None:
        """Nothing adds to the step read closed last any more: make its record."""
        fact, self._finished = self._finished, None
        if fact is None:
            return
        record = _record(self.rank, fact, self._wall_offset, self.total_steps)
        if self._sampled:
            self._take_sampled(record)
        if not self._waiting and late.PLAIN.issuperset(map(type, record.values())):  # None is not: it leaves its field out
            self._emit(record)  # every value a number already (no guard ran: a step without an optimizer's)
        else:
            self._waiting.append(_split(record))
            self._send_ready()

    def _take_sampled(self, record: wire.Frame) -> None:
        """The record takes what was sampled since the last one; a comm reading says
        which step it measured (comm_step), found by its wall time among the steps kept.

        DDP times the forward and backward that synchronise, and only those: in a step that
        accumulated gradients over micro-batches (no_sync, or nanoGPT's
        require_backward_grad_sync) that is the last one. The step's compute is then taken as
        that one's times the step's micro-batches, which are alike in a script that splits
        its batch: otherwise a rank slow in all of them would seem slow in one, and its
        lag a fraction of what it costs the others (model/lag.py)."""
        sampled, self._sampled = self._sampled, {}
        wall = sampled.pop("comm_wall", None)
        if wall is not None:
            at = wall - self._wall_offset
            found = next(((s, micro) for s, start, end, micro in reversed(self._spans) if start <= at <= end), None)
            if found is not None:
                sampled["comm_step"] = found[0]
                if found[1] > 1 and "compute_ms" in sampled:
                    sampled["compute_ms"] *= found[1]
        record.update(sampled)

    def _send_ready(self) -> None:
        """Send the waiting records, oldest first, as long as all of each one's values are ready;
        past MAX_WAITING the oldest goes with those that are (a loop, not all() over a generator:
        this runs for every record on a GPU)."""
        while self._waiting:
            head, lates = self._waiting[0]
            force = len(self._waiting) > MAX_WAITING
            if not force:
                for value in lates.values():
                    if not value.ready():
                        return
            self._waiting.pop(0)
            self._emit(_resolve(head, lates, wait=not force))  # all ready, unless forced: reading them waits for nothing


def _record(rank: int, fact: StepFacts, wall_offset: float, total_steps: int | None) -> wire.Frame:
    """A closed step's record, from its facts; wall_offset turns the tracker's clock into Unix time."""
    start, first, end = fact.start, fact.first, fact.end
    began = start if start is not None else first
    record: wire.Frame = {
        "type": "step",
        "rank": rank,
        "step": fact.step,
        "wall": wall_offset + end,
        "step_ms": (end - began) * 1000.0 if began is not None else 0.0,
    }
    evaluated = fact.evaluation
    took = 0.0 if evaluated is None else evaluated[1] - evaluated[0]
    if evaluated is not None:
        record["eval_ms"] = took * 1000.0
        record["eval_ended"] = wall_offset + evaluated[1]
    if start is not None and first is not None:
        record["data_ms"] = max(0.0, (first - start - took) * 1000.0)
    if fact.samples:
        record["samples"] = fact.samples
    if fact.tokens:
        record["tokens"] = fact.tokens
    if total_steps is not None:
        record["total_steps"] = total_steps
    record.update(fact.values)
    _own_work(record)
    if fact.loss is not None:
        record["loss"] = fact.loss  # taken on the training thread already: a number, or a Late
    read = record.get(late.FIELDS)
    if type(read) is late.Read:  # a CPU step's pack, read on the host already: decoded now
        del record[late.FIELDS]
        _add_fields(record, read.get())
    return record


def _own_work(record: wire.Frame) -> None:
    """A sharded step whose collectives were timed (COMM_WAIT, now or read late): its own
    work, compute_ms, is the step less its data wait and its wait in them."""
    wait = record.pop(COMM_WAIT, None)
    if wait is None:
        return
    record["comm_step"] = record["step"]
    if "eval_ms" not in record and "data_ms" in record:
        record["compute_ms"] = max(0.0, record["step_ms"] - record["data_ms"] - wait)


def _add_fields(record: wire.Frame, fields: dict[str, Any]) -> None:
    """The guard's fields (late.FIELDS), added without replacing what the record has (monitor.step's loss)."""
    for name, field in fields.items():
        record.setdefault(name, field)


def _split(record: wire.Frame) -> tuple[wire.Frame, dict[str, late.Late]]:
    """The record without its Late values and unknowns (None), and its Late values. Most of a
    record's values are read already (late.PLAIN): passed over without a call."""
    lates: dict[str, late.Late] = {}
    plain = late.PLAIN
    for key, value in list(record.items()):
        if type(value) in plain:
            continue
        if value is None:
            del record[key]
        elif late.is_late(value):
            lates[key] = record.pop(key)
    return record, lates


def _resolve(record: wire.Frame, lates: dict[str, late.Late], wait: bool) -> wire.Frame:
    """The record with its Late values read; those not ready, or read as None,
    are left out (unless wait: then every one is read, at no wait where all are ready).
    One that reads as a dict (the guard's FIELDS, a timed step's comm on a GPU) gives
    fields, which add to the record without replacing what it has (monitor.step's loss)."""
    for key, value in lates.items():
        if wait or value.ready():
            got = value.get()
            if got is None:
                continue
            if type(got) is dict:
                _add_fields(record, got)
            else:
                record[key] = got
    _own_work(record)
    return record
