"""The watchdog's verdicts: rules over the job's records, nothing else.

Fed every record the supervisor logs (`observe`) and ticked about twice a
second (`tick`), it returns verdicts; the supervisor (supervise.py) records
them as alerts and carries out their actions. It never touches a process
or a file itself, so every rule is tested with plain records.

| rule      | seen from                                             | action            |
|-----------|-------------------------------------------------------|-------------------|
| nan       | step records marked non-finite (the ranks' guard.py)  | --on-nan          |
| desync    | parameter checksums of one step that differ           | --on-desync       |
| hang      | no rank's step advanced for --hang-timeout            | stacks, --on-hang |
| straggler | a rank's own work per step over STRAGGLER_ALERT x     | alert only        |
| crash     | torchrun's worker_failure records (its probe)         | torchrun restarts |
| crash-loop| the same crash --crash-loop times in the window       | stop              |

Times are the supervisor's own monotonic clock at arrival, so ranks on
other hosts with skewed clocks cannot fake or hide a hang.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddptop.core import wire
from ddptop.core.model.events import exit_reason, exit_status
from ddptop.core.model.job import JobState

HANG_TIMEOUT_S = 300.0
"""Default: generous for a first step that compiles, well under NCCL's 10 min."""

STARTUP_GRACE_S = 120.0
"""Least time a rank gets before its first step: importing torch, joining
the process group and loading data take far longer than a step, more so
with every rank of a restarted group starting at once."""

GATHER_S = 2.0
"""How long a step's verdict waits for the ranks that have not reported it."""

FAILURE_GATHER_S = 0.3
"""torchrun reports the failures of one poll together; the ones a first
failure causes follow within a moment. They make one verdict."""

CRASH_LOOP = 3
CRASH_LOOP_WINDOW_S = 600.0
"""Default: three alike failures in ten minutes are a loop, not bad luck."""

STRAGGLER_ALERT = 2.0
STRAGGLER_CLEAR = 1.5
STRAGGLER_TICKS = 3
STRAGGLER_MIN_STEPS = 10


@dataclass(frozen=True)
class WatchPolicy:
    on_nan: str = "auto"
    on_desync: str = "warn"
    on_hang: str = "restart"
    hang_timeout: float = HANG_TIMEOUT_S
    crash_loop: int = CRASH_LOOP
    crash_loop_window: float = CRASH_LOOP_WINDOW_S


@dataclass
class Verdict:
    kind: str
    text: str
    action: str = "none"
    """none, restart (the group) or stop (the job)."""
    ranks: list[int] = field(default_factory=list)
    step: int | None = None
    stacks: list[int] = field(default_factory=list)
    """Ranks whose Python stacks to collect before acting."""
    details: dict[str, Any] = field(default_factory=dict)

    def record(self) -> wire.Frame:
        return {
            "type": "alert",
            "wall": time.time(),
            "kind": self.kind,
            "rank": self.ranks[0] if len(self.ranks) == 1 else None,
            "ranks": self.ranks,
            "step": self.step,
            "text": self.text,
            "action": self.action,
            **self.details,
        }


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, sorted(ranks)))


def crash_excerpt(log: list[str], lines: int) -> list[str]:
    """What of a failed rank's stderr tail a crash verdict carries.

    A faulthandler report (a fatal signal) is kept from its first line on,
    less the threads that were in no Python code (gloo's and other native
    threads, which ddptop gives a Python thread state), so that the error
    and the Python stacks fit; any other log gives its last lines.
    """
    start = next((i for i, line in enumerate(log) if line.startswith("Fatal Python error")), None)
    if start is None:
        return log[-lines:]
    kept: list[str] = []
    report = log[start:]
    index = 0
    while index < len(report):
        if report[index].startswith("Thread 0x") and index + 1 < len(report) and "<no Python frame>" in report[index + 1]:
            index += 3 if index + 2 < len(report) and not report[index + 2].strip() else 2
            continue
        kept.append(report[index])
        index += 1
    return kept[: 3 * lines]


def last_error_line(log: list[str]) -> str | None:
    """The line of a rank's stderr that best says how it died.

    faulthandler's report of a fatal signal ends with a list of extension
    modules; the telling part is the error and the innermost Python frame of
    the thread that took the signal (listed after the other threads).
    """
    for index, line in enumerate(log):
        if line.startswith("Fatal Python error"):
            report = log[index:]
            current = next((i for i, f in enumerate(report) if f.startswith("Current thread")), 0)
            frame = next((f.strip() for f in report[current:] if f.strip().startswith("File ")), None)
            return line.strip() + (f" in {frame}" if frame else "")
    return next((line.strip() for line in reversed(log) if line.strip()), None)


class _StepGather:
    """Per-rank values for one step, complete when every rank has given one."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.values: dict[int, Any] = {}


class Watchdog:
    def __init__(
        self,
        policy: WatchPolicy,
        state: JobState,
        log_tail: Callable[[wire.Frame], list[str]] = lambda failure: [],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.state = state
        self.log_tail = log_tail
        self.clock = clock
        self._restart: dict[int, int] = {}
        self._progress: dict[int, float] = {}
        self._stepped: set[int] = set()
        self._heard: dict[int, float] = {}
        self._gone: dict[int, float] = {}
        self._nan: dict[tuple[int, int], _StepGather] = {}
        self._sums: dict[tuple[int, int], _StepGather] = {}
        self._desynced: frozenset[int] = frozenset()
        self._hang_reported = False
        self._slow: dict[int, int] = {}
        self._straggling: set[int] = set()
        self._failures: list[wire.Frame] = []
        self._failures_since = 0.0
        self._expected_deaths: set[int] = set()
        self._ended = -1
        """The newest attempt ended on purpose or already judged: its failures are consequences."""
        self._exceptions: dict[int, str] = {}
        self._crashes: deque[tuple[float, tuple[int, str]]] = deque()

    def expect_deaths(self, pids: set[int]) -> None:
        """Processes the supervisor kills on purpose: their deaths are not crashes."""
        self._expected_deaths |= pids

    def expect_group_restart(self, attempt: int | None = None) -> None:
        """An attempt ends (default: the newest a rank said hello in): whatever fails in it is a consequence.

        On one node the killed ranks are all of them; across nodes, the other
        nodes' ranks fail of the broken collective before their torchrun
        restarts them, and those failures are not crashes either. The attempt
        is torchrun's (the probe's count in each failure), not the ranks'
        hellos: a rank of the next attempt may fail before its hello is read.
        """
        self._ended = max(self._ended, max(self._restart.values(), default=0) if attempt is None else attempt)

    def judging(self) -> bool:
        """Whether failures are still gathered, not yet judged (a crash-loop stop may come)."""
        return bool(self._failures)

    def observe(self, record: wire.Frame) -> list[Verdict]:
        kind = record.get("type")
        now = self.clock()
        if kind == "rank_hello":
            rank = record["rank"]
            self._restart[rank] = record["restart"]
            self._progress[rank] = self._heard[rank] = now
            self._stepped.discard(rank)
            self._exceptions.pop(rank, None)
            self._gone.pop(rank, None)
            self._hang_reported = False
        elif kind == "heartbeat":
            self._heard[record["rank"]] = now
        elif kind == "exception":
            self._exceptions[record["rank"]] = record["text"]
        elif kind == "rank_gone":
            self._gone[record["rank"]] = now
        elif kind == "worker_failure":
            if record["pid"] not in self._expected_deaths and record["restart"] > self._ended:
                if not self._failures:
                    self._failures_since = now
                self._failures.append(record)
        elif kind == "step":
            return self._on_step(record, now)
        return []

    def _on_step(self, record: wire.Frame, now: float) -> list[Verdict]:
        rank = record["rank"]
        self._progress[rank] = self._heard[rank] = now
        self._stepped.add(rank)
        self._hang_reported = False
        gathered = False
        if record.get("nonfinite"):
            key = (self._restart.get(rank, 0), record["step"])
            gather = self._nan.setdefault(key, _StepGather(now))
            gather.values[rank] = (record.get("local_nonfinite"), record.get("skipped") == "nan")
            gathered = True
        if record.get("checksum") is not None:
            key = (self._restart.get(rank, 0), record["step"])
            self._sums.setdefault(key, _StepGather(now)).values[rank] = record["checksum"]
            gathered = True
        # Only a record that joined a gather can complete one; the tick judges those that time out.
        return self._complete(now) if gathered else []

    def tick(self, final: bool = False) -> list[Verdict]:
        """Time-based verdicts; final (the job has ended) judges what is pending now."""
        if final:
            return self._complete(float("inf")) + self._crash(float("inf"))
        now = self.clock()
        verdicts = self._complete(now)
        verdicts += self._crash(now)
        verdicts += self._hang(now)
        verdicts += self._stragglers()
        return verdicts

    def _complete(self, now: float) -> list[Verdict]:
        """Verdicts on steps every rank has reported, or that waited long enough."""
        world = self.state.world_size
        verdicts = []
        for table, judge in ((self._nan, self._nan_verdict), (self._sums, self._desync_verdict)):
            for key in [k for k, g in table.items() if len(g.values) >= world or now - g.since > GATHER_S]:
                verdict = judge(key[1], table.pop(key).values)
                if verdict is not None:
                    verdicts.append(verdict)
        return verdicts

    def _nan_verdict(self, step: int, ranks: dict[int, tuple[bool | None, bool]]) -> Verdict:
        """ranks: each rank's (own gradients non-finite, skipped the step)."""
        named = sorted(r for r, (bad, _) in ranks.items() if bad)
        source = f"{_ranks(named)}'s own gradients were" if named else "no rank's own gradients were seen as"
        then = {"restart": "; restarting the group", "stop": "; stopping the job"}.get(self.policy.on_nan, "")
        if all(skipped for _, skipped in ranks.values()):
            handling = "step skipped on all ranks" + then
        elif self.policy.on_nan == "auto":
            handling = "applied: CUDA ranks read this check a step late instead of waiting for it (--on-nan skip skips such steps)"
        else:
            handling = f"applied anyway (--on-nan {self.policy.on_nan})" + then
        return Verdict(
            "nan",
            f"non-finite loss or gradients at step {step}: {source} non-finite; {handling}",
            action=self.policy.on_nan if self.policy.on_nan in ("restart", "stop") else "none",
            ranks=named,
            step=step,
        )

    def _desync_verdict(self, step: int, sums: dict[int, int]) -> Verdict | None:
        counts = Counter(sums.values())
        if len(counts) == 1:
            self._desynced = frozenset()
            return None
        common, votes = counts.most_common(1)[0]
        if votes * 2 > len(sums):
            odd = sorted(r for r, v in sums.items() if v != common)
            text = (
                f"parameters differ at step {step}: {_ranks(odd)} "
                + ", ".join(f"{sums[r]:016x}" for r in odd)
                + f"; the other {votes} ranks {common:016x}"
            )
        else:
            odd = sorted(sums)
            text = f"parameters differ at step {step}, no majority: " + ", ".join(f"rank {r} {v:016x}" for r, v in sorted(sums.items()))
        if frozenset(odd) == self._desynced:
            return None  # the same ranks as before: one alert per divergence
        self._desynced = frozenset(odd)
        return Verdict(
            "desync",
            text,
            action=self.policy.on_desync if self.policy.on_desync != "warn" else "none",
            ranks=odd,
            step=step,
            details={"checksums": {str(r): f"{v:016x}" for r, v in sums.items()}},
        )

    def _live(self) -> list[int]:
        return [r for r in self._progress if r not in self._gone]

    def _hang(self, now: float) -> list[Verdict]:
        if self._hang_reported:
            return []
        live = self._live()
        timeout = self.policy.hang_timeout
        startup = max(timeout, STARTUP_GRACE_S)
        limit = {r: timeout if r in self._stepped else startup for r in live}
        if not any(now - self._progress[r] > limit[r] for r in live):
            return []
        # The first rank past the limit is named with every rank stuck alongside
        # it: a rank whose last step landed a moment later waits just the same.
        stuck = [r for r in live if now - self._progress[r] > limit[r] / 2]
        self._hang_reported = True
        silent = sorted(r for r in stuck if now - self._heard.get(r, 0.0) > timeout)
        where: dict[tuple[str, int], list[int]] = {}
        for rank in stuck:
            if rank in silent:
                continue
            state = self.state.ranks.get(rank)
            phase, step = (state.phase, state.step) if state else ("startup", -1)
            where.setdefault((phase, step), []).append(rank)
        parts = [
            f"{_ranks(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {phase} "
            + ("before the first step" if step < 0 else f"after step {step}")
            for (phase, step), ranks in sorted(where.items(), key=lambda item: -len(item[1]))
        ]
        if silent:
            parts.append(f"{_ranks(silent)} sent nothing for {now - max(self._heard.get(r, 0.0) for r in silent):.0f} s")
        return [
            Verdict(
                "hang",
                f"no step for {now - min(self._progress[r] for r in stuck):.0f} s: " + "; ".join(parts),
                action=self.policy.on_hang,
                ranks=sorted(stuck),
                step=max((s.step for r in stuck if (s := self.state.ranks.get(r))), default=None),
                stacks=sorted(set(stuck) - set(silent)) or sorted(stuck),
            )
        ]

    def _stragglers(self) -> list[Verdict]:
        ratios = self.state.straggler_ratios()
        if len(ratios) < 2:
            return []
        verdicts = []
        for rank, ratio in ratios.items():
            state = self.state.ranks[rank]
            if ratio < STRAGGLER_CLEAR:
                self._slow.pop(rank, None)
                self._straggling.discard(rank)
                continue
            if ratio < STRAGGLER_ALERT or len(state.window.points) < STRAGGLER_MIN_STEPS:
                continue
            self._slow[rank] = self._slow.get(rank, 0) + 1
            if self._slow[rank] >= STRAGGLER_TICKS and rank not in self._straggling:
                self._straggling.add(rank)
                busy = state.busy_ms() or 0.0
                verdicts.append(
                    Verdict(
                        "straggler",
                        f"rank {rank} is a straggler: its own work per step is {ratio:.1f}x the job's median "
                        f"({busy:.0f} ms vs {busy / ratio:.0f} ms); the other ranks wait for it in the all-reduce",
                        ranks=[rank],
                        step=state.step,
                        details={"ratio": round(ratio, 2)},
                    )
                )
        return verdicts

    def _crash(self, now: float) -> list[Verdict]:
        if not self._failures or now - self._failures_since < FAILURE_GATHER_S:
            return []
        failures, self._failures = self._failures, []
        # A rank killed by a hard signal (SIGKILL, SIGSEGV...) is a cause, never
        # a consequence: the others die of a collective's error or of torchrun's
        # SIGTERM. A rank that exited with a status of its own comes before one
        # that torchrun stopped (it may have closed its connection first, and
        # may even have said why: its words still count, below). Among the
        # rest, the first connection to close goes first.
        stopped = {0, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP}

        def cause_first(failure: wire.Frame) -> tuple[int, float, float]:
            code = failure["exitcode"]
            order = 2 if code in stopped else 1 if code > 0 else 0
            return order, self._gone.get(failure["rank"], float("inf")), failure["wall"]

        failures.sort(key=cause_first)
        first = failures[0]
        rank = first["rank"]
        # What fails later in this attempt failed of this: on other nodes the
        # broken collective surfaces a moment after, in a gather of its own.
        self.expect_group_restart(first["restart"])
        state = self.state.ranks.get(rank)
        where = "" if state is None else (" before its first step" if state.step < 0 else f" after step {state.step} (in {state.phase})")
        tail = self.log_tail(first)
        error = self._error_line(first, tail)
        text = f"rank {rank} {'failed with ' if first['exitcode'] >= 0 else 'was '}{exit_reason(first['exitcode'])}{where}"
        if error is not None:
            text += f": {error}" if self._exceptions.get(rank) or first.get("message") else f"; its log ends: {error}"
        others = sorted({f["rank"] for f in failures} - {rank})
        if others:
            text += f" ({_ranks(others)} failed after it)"
        crash = Verdict(
            "crash",
            text,
            ranks=[rank],
            step=None if state is None or state.step < 0 else state.step,
            details={"exitcode": first["exitcode"], "log": tail, "traceback": self._exceptions.get(rank) or first.get("message")},
        )
        # Ranks that fail alike at once come first in any order, and only one
        # may have said why (rank 0 printing a usage error): the loop check
        # takes the first words any of them left.
        said = error if error is not None else next(
            (line for f in failures[1:] if (line := self._error_line(f)) is not None), None)
        return [crash, *self._crash_loop(crash, said)]

    def _error_line(self, failure: wire.Frame, tail: list[str] | None = None) -> str | None:
        """The last line of a failed rank's own exception, or of its stderr (tail, if already read)."""
        error = self._exceptions.get(failure["rank"]) or failure.get("message")
        if error and error.strip():
            return error.strip().splitlines()[-1]
        return last_error_line(self.log_tail(failure) if tail is None else tail)

    def _crash_loop(self, crash: Verdict, said: str | None) -> list[Verdict]:
        """Stop the job when the same failure keeps coming back within the window.

        "The same" is the exit status and the error's last line with numbers
        blanked (addresses, sizes and step numbers vary between attempts);
        which rank fails first may change, so it is not part of it. A failure
        that left no words is alike to any of its exit status: whether the
        rank that would have said why did so before torchrun stopped it
        (another rank failing first, silently) varies between attempts.
        """
        now = self.clock()
        exitcode = crash.details["exitcode"]
        words = re.sub(r"0x[0-9a-fA-F]+|\d+", "#", said or "")
        self._crashes.append((now, (exitcode, words)))
        while self._crashes and now - self._crashes[0][0] > self.policy.crash_loop_window:
            self._crashes.popleft()
        alike = [t for t, (code, said_then) in self._crashes
                 if code == exitcode and (said_then == words or not said_then or not words)]
        if len(alike) < self.policy.crash_loop:
            return []
        self._crashes.clear()
        return [
            Verdict(
                "crash-loop",
                f"the same failure {len(alike)} times in {now - alike[0]:.0f} s, stopping the job: {crash.text}",
                action="stop",
                ranks=crash.ranks,
                step=crash.step,
                details={"exitcode": exitcode, "exit_status": exit_status(exitcode)},
            )
        ]
