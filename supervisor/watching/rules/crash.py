"""Crash: a worker that torchrun saw fail, named as the cause of its attempt's failures.

torchrun's probe reports each failed worker (worker_failure). The failures
of one poll, and the ones a first failure causes, arrive within a moment;
they are gathered for FAILURE_GATHER_S and make one verdict, naming the
rank that failed first, how, where it was, the last words it left (its
uncaught exception, or the end of its stderr) and the innermost frame of
the script's own code they show. A failure before the first step that
repeats the previous attempt's (same status, words and frame) stops the
job at once: loading or setup that failed alike twice will fail again. Deaths the supervisor
caused, and failures in an attempt already judged or ended on purpose, are
consequences, not crashes.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from ddptop.core import wire
from ddptop.core.model.events import exit_reason
from ddptop.core.model.job import JobState
from ddptop.core.policy import WatchPolicy
from ddptop.core.rundir import single_node
from ddptop.core.wire import records
from ddptop.supervisor.watching.failures import (
    LogTail,
    exception_line,
    last_error_line,
    last_words,
    port_in_use,
    script_frame,
    spawned_failure,
)
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.rules.crash_loop import CrashLoop, alike, repeated_before_first_step, same_words
from ddptop.supervisor.watching.stuck import IN_STEP, ended_early, in_phase
from ddptop.supervisor.watching.verdict import Verdict, ranks_text

FAILURE_GATHER_S = 0.3
"""torchrun reports the failures of one poll together; the ones a first
failure causes follow within a moment. They make one verdict."""

STOPPED = {0, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP}
"""Exit codes of a rank that torchrun (or the user) stopped, rather than one that failed."""

OOM_KILLED = "; out of memory: the kernel's OOM killer killed {count} in the job's memory cgroup on node {node} during this attempt"
"""Said of a failure when torchrun's memory cgroup counted OOM kills in its attempt (a rank, or one of
its DataLoader workers, which the rank then dies of)."""


def _same(a: tuple[int, str, str | None], b: tuple[int, str, str | None]) -> bool:
    """Two failures (exit status, words, frame) alike: the words as the crash loop compares them
    (which rank spoke before torchrun stopped the others varies), and a frame unknown to one matches."""
    return a[0] == b[0] and same_words(a[1], b[1]) and (a[2] == b[2] or a[2] is None or b[2] is None)


class CrashRule:
    observes = frozenset({"worker_failure", "step", "group_restart"})

    def __init__(
        self,
        policy: WatchPolicy,
        state: JobState,
        liveness: Liveness,
        log_tail: Callable[[records.WorkerFailure], LogTail],
        clock: Callable[[], float],
    ) -> None:
        self.state = state
        self.started = policy.started
        self.clock = clock
        self.liveness = liveness
        self.log_tail = log_tail
        self.loop = CrashLoop(policy)
        self._failures: list[records.WorkerFailure] = []
        self._failures_since = 0.0
        self._complete = False
        """The failures gathered are all there will be (a one-node group is restarting): judge now."""
        self._expected_deaths: set[int] = set()
        self._ended = -1
        """The newest attempt ended on purpose or already judged: its failures are consequences."""
        self._progressed: set[int] = set()
        """Attempts in which a rank finished a step."""
        self._early: tuple[int, tuple[int, str, str | None]] | None = None
        """The last judged failure that came before the first step: (attempt, what it was)."""

    def expect_deaths(self, pids: set[int]) -> None:
        self._expected_deaths |= pids

    def end_attempt(self, attempt: int) -> None:
        self._ended = max(self._ended, attempt)

    def judging(self) -> bool:
        return bool(self._failures)

    def observe(self, record: wire.Record, now: float) -> list[Verdict]:
        if record["type"] == "step":
            self._progressed.add(self.liveness.attempt.get(record["rank"], 0))
            return []
        if record["type"] == "group_restart":
            # torchrun has stopped this node's group to restart it: on one node every failure of
            # the attempt is in, and waiting out the gather would only hold the restart back.
            self._complete = single_node(self.state.meta)
            return []
        if record["type"] == "worker_failure" and record["pid"] not in self._expected_deaths and record["restart"] > self._ended:
            if not self._failures:
                self._failures_since = now
            self._failures.append(record)
        return []

    def final(self) -> list[Verdict]:
        return self.tick(float("inf"))

    def tick(self, now: float) -> list[Verdict]:
        if not self._failures or (now - self._failures_since < FAILURE_GATHER_S and not self._all_in()):
            return []
        self._complete = False
        failures, self._failures = self._failures, []
        failures.sort(key=self._cause_first)
        first = failures[0]
        logged = self.log_tail(first)
        tail = logged.lines
        # A script that starts its own ranks: the worker that failed is their parent, whose spawn says which child failed, and how.
        spawned = spawned_failure(first.get("message") or "\n".join(tail)) if self.started.style == "spawn" else None
        rank = self._rank_of(first, spawned)
        exitcode = spawned[1] if spawned is not None and spawned[1] is not None else first["exitcode"]
        # What fails later in this attempt failed of this: on other nodes the
        # broken collective surfaces a moment after, in a gather of its own.
        self.end_attempt(first["restart"])
        state = self.state.ranks.get(rank)
        # A rank killed at once leaves its last records unsent; its peers in the attempt stepped with it.
        reached = max((r.step for r in self.state.ranks.values() if r.restart == first["restart"]), default=-1)
        step = -1 if state is None else max(state.step, reached)
        where = ""
        if state is not None:
            where = " before its first step" if step < 0 else f" after step {step}"
            # A rank that raised said where; its heartbeats since say only that it was shutting down.
            # One killed (a signal, the OOM killer) was last seen where its last heartbeat, up to a
            # second before, found it: said only if that was in the step it died in.
            if (phase := self.liveness.raised_in.get(rank)) is not None:
                where += f" (in {phase})"
            elif step >= 0 and state.phase_step > step:
                where += f" (last seen {in_phase(state.phase)})"
        exceptions = self.liveness.exceptions
        traceback = exceptions.get(rank) or first.get("message")
        error = _quoted(traceback) if traceback and traceback.strip() else self._error_line(first, tail)
        frame = script_frame(traceback or "\n".join(tail))
        text = f"rank {rank} {'failed with ' if exitcode >= 0 else 'was '}{exit_reason(exitcode)}{where}"
        if error is not None:
            text += f": {error}" if traceback else f"; {last_words(logged, first['wall'])}: {error}"
            if frame is not None and frame not in error:
                text += f" at {frame}"
        port = port_in_use(traceback or "\n".join(tail))
        if port is not None:
            text += f"; port {port} is already in use" + (
                f" (MASTER_PORT is set at {self.started.port_set_at})" if self.started.port_set_at else ""
            )
        # The workers of a script that starts its own ranks are no ranks: only the cause is known.
        if self.started.style != "spawn":
            failed = {f["rank"] for f in failures}
            if others := sorted(failed - {rank}):
                text += f" ({ranks_text(others)} failed after it)"
            # A rank that ended first without error (no failure of its own) left this one in a collective.
            if ended := [r for r in self.liveness.ended(first["restart"], self.liveness.gone.get(rank, float("inf"))) if r not in failed]:
                training = (self.liveness.raised_in.get(rank) or (state.phase if state is not None else "exit")) in IN_STEP
                text += "; " + ended_early(ended, self.state, training)
        if killed := max((f.get("oom_kills", 0) for f in failures if f["node"] == first["node"]), default=0):
            text += OOM_KILLED.format(count="a process" if killed == 1 else f"{killed} processes", node=first["node"])
        crash = Verdict(
            "crash",
            text,
            ranks=[rank],
            step=None if step < 0 else step,
            details={"exitcode": first["exitcode"], "log": tail, "traceback": traceback},
        )
        # Ranks that fail alike at once come first in any order, and only one
        # may have said why (rank 0 printing a usage error): the loop check
        # takes the first words any of them left.
        said = error if error is not None else next((line for f in failures[1:] if (line := self._error_line(f)) is not None), None)
        if first["restart"] not in self._progressed:
            early, self._early = self._early, (first["restart"], (first["exitcode"], alike(said), frame))
            if early is not None and early[0] < first["restart"] and _same(early[1], self._early[1]):
                return [crash, repeated_before_first_step(crash, (early[0], first["restart"]))]
        else:
            self._early = None
        return [crash, *self.loop.after(crash, said, self.clock())]

    def _all_in(self) -> bool:
        """Whether every word of the failed attempt has arrived: torchrun restarts this (only) node's
        group, and each of the attempt's ranks has closed its connection, after its last record
        (its uncaught exception among them)."""
        attempt = self._failures[0]["restart"]
        seen = self.liveness
        return self._complete and all(rank in seen.gone for rank, a in seen.attempt.items() if a == attempt)

    def _rank_of(self, failure: records.WorkerFailure, spawned: tuple[int, int | None] | None) -> int:
        """The rank a failure is of: torchrun's worker, or, for a script that starts
        its own ranks (the failed worker is their parent), the child its spawn names
        as the one that failed (its index among this node's ranks); failing that, the
        first of its ranks in that attempt to go, one that left an exception before one
        that did not (a rank the others' failure broke may raise too, but later)."""
        if self.started.style != "spawn":
            return failure["rank"]
        seen = self.liveness
        ranks = [r for r, attempt in seen.attempt.items() if attempt == failure["restart"]]
        mine = sorted(r for r in ranks if (state := self.state.ranks.get(r)) is not None and state.node == failure["node"])
        if spawned is not None and spawned[0] < len(mine):
            return mine[spawned[0]]
        said = [r for r in ranks if r in seen.exceptions]
        return min(said or ranks, key=lambda r: seen.gone.get(r, float("inf")), default=failure["rank"])

    def _cause_first(self, failure: records.WorkerFailure) -> tuple[int, float, float]:
        """A rank killed by a hard signal (SIGKILL, SIGSEGV...) is a cause, never
        a consequence: the others die of a collective's error or of torchrun's
        SIGTERM. A rank that exited with a status of its own comes before one
        that torchrun stopped (it may have closed its connection first, and
        may even have said why: its words still count). Among the rest, the
        first connection to close goes first."""
        code = failure["exitcode"]
        order = 2 if code in STOPPED else 1 if code > 0 else 0
        return order, self.liveness.gone.get(failure["rank"], float("inf")), failure["wall"]

    def _error_line(self, failure: records.WorkerFailure, tail: list[str] | None = None) -> str | None:
        """The line of a failed rank's own exception that names it, or of its stderr (tail, if already read)."""
        error = self.liveness.exceptions.get(failure["rank"]) or failure.get("message")
        if error and error.strip():
            return _quoted(error)
        return last_error_line(self.log_tail(failure).lines if tail is None else tail)


def _quoted(traceback: str) -> str:
    """What a crash alert quotes of a rank's exception: the line that names it, else its text's last line."""
    lines = traceback.strip().splitlines()
    return exception_line(lines) or lines[-1]
