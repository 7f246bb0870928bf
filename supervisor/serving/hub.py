"""The supervisor's serving half: records in, logged, folded, fanned out.

Every record, whether from a rank or made by the supervisor, goes through
`record()`: encoded once, appended to the event log, folded into the job
state and queued for every attached dashboard. So the log is the full story
a replay or export reads, and a dashboard sees what the log holds. The hub
knows nothing of torchrun, which is what lets tests and benchmarks drive it
with synthetic ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

from ddptop.core import wire
from ddptop.core.eventlog import EventLog
from ddptop.core.model import snapshot
from ddptop.core.model.job import JobState
from ddptop.core.rundir import RunDir
from ddptop.core.wire import records
from ddptop.supervisor.outlets import Outlets
from ddptop.supervisor.serving.collector import Collector
from ddptop.supervisor.serving.viewers import CommandHandler, Viewers

EVENT_LOG = "the event log"
SNAPSHOT = "the state snapshot"
SNAPSHOT_EVERY_S = 30.0
"""How often, at most, the state is saved while the job runs: a replay of a run
whose supervisor died reads at most this much of its log after the snapshot."""
SNAPSHOT_SHARE = 0.01
"""The most of the supervisor's time the periodic snapshot may take: a state
that takes longer to save is saved less often (90 ms at 1,024 ranks)."""
UNLOGGED = frozenset({"log_tail"})
"""Answers to a dashboard's question, not part of the run's story: shown, not logged."""


class Hub:
    def __init__(
        self,
        run: RunDir,
        on_command: CommandHandler,
        observer: Callable[[wire.Record], None] | None = None,
        outlets: Outlets | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """observer sees every record after the state has folded it in (the watchdog); outlets
        handles the event log's write errors: the state, the dashboards and the watchdog go on
        from memory while the log cannot be written."""
        self.run = run
        self.observer = observer
        self.outlets = outlets or Outlets()
        self.state = JobState()
        self.log = EventLog(run.events_path)
        self.viewers = Viewers(self.log, self.snapshot_frames, on_drop=self.note)
        self.collector = Collector(self.record, self.viewers, on_command)
        self.snapshot_s: float | None = None
        """Seconds the last periodic snapshot took (bench/scale.py reports it)."""
        self._clock = clock
        """When the periodic snapshot is due, by this clock (a bench's is simulated)."""
        self._next_snapshot = clock() + SNAPSHOT_EVERY_S
        self._stopping_for: tuple[int, dict[str, str]] | None = None
        """The attempt the supervisor is stopping itself, and why (stopping_for)."""
        self._attempt = 0
        """The latest attempt torchrun started: its group_restart comes before any of its hellos."""
        self.taps: list[Callable[[wire.Record, bytes], None]] = []
        """Also given every record and its encoding: a node's uplink to the aggregator."""

    def record(self, frame: wire.Record) -> None:
        if frame["type"] == "group_restart":
            self._attempt = max(self._attempt, frame["restart"])
            if self._stopping_for is not None:
                frame = cast(records.GroupRestart, {**frame, **self._stopping_for[1]})  # ordered or asked: both GroupRestart's
        elif frame["type"] == "rank_hello" and self._stopping_for is not None and frame["restart"] > self._stopping_for[0]:
            self._stopping_for = None  # the restarted group is up
        data = wire.encode(frame)
        if frame["type"] not in UNLOGGED:
            self.log.write(data)  # never raises: its failures are said by the flush below
        self.state.ingest(frame)
        self.viewers.broadcast(data)
        for tap in self.taps:
            tap(frame, data)
        if self.observer is not None:
            self.observer(frame)

    def stopping_for(self, why: dict[str, str]) -> None:
        """The supervisor stops the current attempt's group itself: {"ordered": a verdict's kind}
        or {"asked": the user's request in words}. Every node's torchrun record of the restart is
        marked with it until the next attempt says hello, since the rank such a record names is
        only one ddptop killed. The attempt stopped is the latest torchrun started, which may have
        said no hello yet (a restart asked right after another)."""
        self._stopping_for = (max(self.state.restarts, self._attempt), why)

    def snapshot_frames(self) -> list[bytes]:
        """The job's state as encoded frames, for a dashboard attaching now."""
        return [wire.encode(frame) for frame in snapshot.frames(self.state)]

    def keep_state(self) -> None:
        """Save the state beside the log, as of the log's end on disk, every SNAPSHOT_EVERY_S or
        less often when it is slow to save: a replay of a run whose supervisor was killed, or
        whose machine lost power, starts from it and reads only the log after it."""
        now = self._clock()
        if now < self._next_snapshot or not self.outlets.write(EVENT_LOG, self.log.flush):
            return
        started = time.perf_counter()
        self.outlets.write(SNAPSHOT, snapshot.save, self.run.snapshot_path, self.state, self.log.position())
        self.snapshot_s = time.perf_counter() - started
        self._next_snapshot = now + max(SNAPSHOT_EVERY_S, self.snapshot_s / SNAPSHOT_SHARE)

    def note(self, text: str) -> None:
        """A notice of the supervisor's own, for the log and every dashboard."""
        self.record({"type": "notice", "wall": time.time(), "text": text})

    def flush(self) -> None:
        self.outlets.write(EVENT_LOG, self.log.flush)

    async def start(self) -> None:
        await self.collector.start_unix(self.run.socket_path)

    def record_totals(self) -> None:
        """The per-second job summary that dashboards plot."""
        self.record(self.state.summary(time.time()))

    async def finish(self, code: int, stopped_by_signal: int | None = None, now: float | None = None) -> None:
        """The job is over: last summary and exit record (at now: when the job ended), then close
        every connection."""
        await self.collector.ranks_done()
        self.record_totals()
        now = time.time() if now is None else now
        end: records.Exit = {"type": "exit", "wall": now, "code": code, "goodput": self.state.goodput.split(now)}
        if stopped_by_signal is not None:
            end["stopped_by_signal"] = stopped_by_signal
        self.record(end)
        self.viewers.close_all()
        await self.collector.close()
        if self.outlets.write(EVENT_LOG, self.log.close):
            self.outlets.write(SNAPSHOT, snapshot.save, self.run.snapshot_path, self.state, self.log.position())
