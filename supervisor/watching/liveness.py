"""What the watchdog knows of each rank from its records, that several rules read.

Times are the supervisor's own monotonic clock at arrival, so ranks on
other hosts with skewed clocks cannot fake or hide a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.core import wire
from ddptop.core.wire import records

BUSY_CPU = 50.0
"""A rank's CPU percent over the supervisor's last sample (one core is 100) that says it works."""
BUSY_IO = float(1 << 20)
"""A rank's bytes a second to and from storage over the supervisor's last sample that say it works:
a checkpoint written to slow storage sleeps in the kernel, its CPU idle and its stack on one line,
while its pages go out. Above what a log file or an event file's flush writes."""
BUSY_HEARD_S = 3.0
"""How recently a busy rank must have been heard from for its CPU or storage to count: one whose main
thread holds the GIL in native code (a regex that backtracks for ever) burns a core and
sends no heartbeat, and is stuck, not working."""


@dataclass
class Liveness:
    attempt: dict[int, int] = field(default_factory=dict)
    """rank -> the restart count of its latest hello."""
    progress: dict[int, float] = field(default_factory=dict)
    """rank -> when it last finished a step (or said hello)."""
    done: dict[int, int] = field(default_factory=dict)
    """rank -> the last step it finished, as its step records and heartbeats tell: a heartbeat
    tells it while the step's record is still held in the rank (until its next forward)."""
    moved: dict[int, float] = field(default_factory=dict)
    """rank -> when it was last seen working: its stack changed, its model ran a forward, it
    kept a CPU busy or moved data to or from storage outside any collective, or it finished a
    step. A rank that waits or is stuck sits still."""
    waiting: dict[int, bool] = field(default_factory=dict)
    """rank -> whether its last heartbeat found it in a torch.distributed call or in a collective
    it entered and that has not completed: a busy CPU there is a wait (CUDA's spin), not work."""
    forwards: dict[int, int] = field(default_factory=dict)
    """rank -> its model's forwards so far, as its last heartbeat counted them."""
    collectives: dict[int, list[records.Collective]] = field(default_factory=dict)
    """rank -> where it stands in each of its process groups' collectives (records.Collective),
    from its heartbeat (only ranks that sat on one step a while send it)."""
    completed: dict[str, int] = field(default_factory=dict)
    """group -> the furthest collective any of its ranks has told completed in this attempt
    (Collective's group is the job's name of it, the same on every rank of the group)."""
    checkpointing: set[int] = field(default_factory=set)
    """Ranks whose last heartbeat found them saving or loading a checkpoint (torch.save, torch.distributed.checkpoint)."""
    heard: dict[int, float] = field(default_factory=dict)
    """rank -> when it last sent anything."""
    stepped: set[int] = field(default_factory=set)
    """Ranks that finished a step in their current attempt."""
    gone: dict[int, float] = field(default_factory=dict)
    """rank -> when its connection closed."""
    exceptions: dict[int, str] = field(default_factory=dict)
    """rank -> the traceback of the exception it died of, in its current attempt."""
    raised_in: dict[int, str] = field(default_factory=dict)
    """rank -> the phase it was in when it raised that exception (its heartbeats say "exit" after)."""
    exiting: set[int] = field(default_factory=set)
    """Ranks whose last heartbeat found their interpreter shutting down (the script's end, or a
    sys.exit), not killed."""
    world_size: int = 0
    """The newest attempt's world size, as its ranks' hellos tell it: the ranks to hear from."""

    def observe(self, record: wire.Record, now: float) -> None:
        if record["type"] == "rank_hello":
            rank = record["rank"]
            newest = self.newest_attempt()
            if record["restart"] > newest:
                self.world_size = record["world_size"]
                self.completed.clear()  # a new attempt counts its collectives from 1
            elif record["restart"] == newest:
                self.world_size = max(self.world_size, record["world_size"])
            self.attempt[rank] = record["restart"]
            self.progress[rank] = self.heard[rank] = self.moved[rank] = now
            self.done.pop(rank, None)
            self.forwards.pop(rank, None)
            self.collectives.pop(rank, None)
            self.waiting.pop(rank, None)
            self.checkpointing.discard(rank)
            self.stepped.discard(rank)
            self.exceptions.pop(rank, None)
            self.raised_in.pop(rank, None)
            self.exiting.discard(rank)
            self.gone.pop(rank, None)
        elif record["type"] == "step":
            rank = record["rank"]
            self.heard[rank] = now
            self._finished(rank, record["step"], now)
        elif record["type"] == "heartbeat":
            self._heartbeat(record, now)
        elif record["type"] == "sample":
            self._busy(record, now)
        elif record["type"] == "exception":
            self.exceptions[record["rank"]] = record["text"]
            if "phase" in record:
                self.raised_in[record["rank"]] = record["phase"]
        elif record["type"] == "rank_gone":
            self.gone[record["rank"]] = now

    def _finished(self, rank: int, step: int, now: float) -> None:
        if step > self.done.get(rank, -1) or rank not in self.stepped:
            self.done[rank] = max(step, self.done.get(rank, step))
            self.progress[rank] = self.moved[rank] = now
            self.stepped.add(rank)

    def _heartbeat(self, record: records.Heartbeat, now: float) -> None:
        rank = record["rank"]
        self.heard[rank] = now
        if rank not in self.done:  # the first since hello: where a resumed rank starts, no step yet
            self.done[rank] = record["step"] - 1
        elif record["step"] - 1 > self.done[rank]:
            self._finished(rank, record["step"] - 1, now)
        forwards = record.get("forwards")
        if record.get("stack") is not None or (forwards is not None and forwards != self.forwards.get(rank, forwards)):
            self.moved[rank] = now
        if forwards is not None:
            self.forwards[rank] = forwards
        if record.get("collectives") is not None:
            self.collectives[rank] = record["collectives"]
            for collective in record["collectives"]:
                group = collective["group"]
                self.completed[group] = max(self.completed.get(group, 0), collective["completed"])
        else:
            self.collectives.pop(rank, None)
        if record.get("phase") == "checkpoint":
            self.checkpointing.add(rank)
        else:
            self.checkpointing.discard(rank)
        if record.get("phase") == "exit":
            self.exiting.add(rank)
        else:
            self.exiting.discard(rank)
        self.waiting[rank] = record.get("inside") is not None or self.entered(rank) is not None

    def entered(self, rank: int) -> records.Collective | None:
        """The collective the rank's flight recorder says it entered and has not completed
        (DDP's all-reduce in its backward), as its last heartbeat told it; None when none.

        None too for a rank writing or reading a checkpoint: DDP's all-reduces were done when its
        backward returned, and a recorder may not have marked the last one completed yet (gloo's
        marks a collective that nothing waited on by its work later, if ever). A collective the
        checkpoint makes itself (torch.distributed.checkpoint's) is a torch.distributed call on
        its stack: the heartbeat's `inside`.

        A collective another rank of its group completed is complete on this one too: every rank
        had entered it. Gloo's recorder marks a rank's own completion late, if ever, and a rank
        stuck since in its data loader would read as waiting in the all-reduce it finished."""
        if rank in self.checkpointing:
            return None
        completed = self.completed
        return next((c for c in self.collectives.get(rank, ()) if c["enqueued"] > max(c["completed"], completed.get(c["group"], 0))), None)

    def _busy(self, record: records.Sample, now: float) -> None:
        """A rank that kept a CPU busy over the last second, or moved data to or from storage,
        outside any collective, is working even where its stack reads the same at every
        heartbeat: rank 0 evaluating through `model.module` (no DDP forward to count) a model
        whose blocks are one code, so every sample lands on the same conv line; rank 0 writing
        a checkpoint to slow storage, asleep in the kernel while its pages go out. One whose
        write hangs (a dead NFS server) moves nothing, and is stuck."""
        for proc in record.get("procs", ()):
            rank = proc.get("rank")
            working = (proc.get("cpu") or 0.0) >= BUSY_CPU or (proc.get("io") or 0.0) >= BUSY_IO
            busy = working and not self.waiting.get(rank, False)
            if busy and rank in self.progress and now - self.heard.get(rank, now - BUSY_HEARD_S) < BUSY_HEARD_S:
                self.moved[rank] = now

    def still(self, rank: int, now: float) -> float:
        """Seconds the rank has sat still: no step, no forward, its stack the same, its CPU and
        storage idle or waiting."""
        return now - self.moved.get(rank, now)

    def live(self) -> list[int]:
        """Ranks that said hello and whose connection has not closed since."""
        return [r for r in self.progress if r not in self.gone]

    def newest_attempt(self) -> int:
        return max(self.attempt.values(), default=0)

    def ended(self, attempt: int, before: float = float("inf")) -> list[int]:
        """Ranks of an attempt that ended of themselves before `before`: their interpreter shut
        down with no exception and their connection closed. A rank that exits while its peers
        train on (one given fewer batches than the others) leaves them in a collective it never
        joins; whether it failed is torchrun's to say (a worker_failure), which the callers know."""
        return sorted(
            rank
            for rank, when in self.gone.items()
            if when < before and rank in self.exiting and rank not in self.exceptions and self.attempt.get(rank) == attempt
        )

    def unheard(self) -> list[int]:
        """Ranks of the newest attempt's world that have not said hello in it. A rank that stops,
        or holds the GIL in native code, before its first word reached the supervisor is one,
        and so is one whose way to the supervisor is cut: its peers can wait for it in a
        collective while nothing else names it."""
        newest = self.newest_attempt()
        return [rank for rank in range(self.world_size) if self.attempt.get(rank) != newest]
