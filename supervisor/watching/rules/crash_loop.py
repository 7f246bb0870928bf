"""Crash loop: the same failure --crash-loop times within --crash-loop-window,
or twice in a row before the first step.

"The same" is the exit status and the error's last line with numbers
blanked (addresses, sizes and step numbers vary between attempts); which
rank fails first may change, so it is not part of it. A failure that left
no words is alike to any of its exit status: whether the rank that would
have said why did so before torchrun stopped it (another rank failing
first, silently) varies between attempts.
"""

from __future__ import annotations

import re
from collections import deque

from ddptop.core.model.events import exit_status
from ddptop.core.policy import WatchPolicy
from ddptop.supervisor.watching.verdict import Verdict


def alike(said: str | None) -> str:
    """A failure's words as compared across attempts: numbers and addresses blanked."""
    return re.sub(r"0x[0-9a-fA-F]+|\d+", "#", said or "")


def same_words(a: str, b: str) -> bool:
    """Two failures' blanked words alike: what one left unsaid matches anything."""
    return a == b or not a or not b


def repeated_before_first_step(crash: Verdict, attempts: tuple[int, int]) -> Verdict:
    """The same failure, before any step, in two attempts in a row: the code or the setup fails
    the same way every time, and a restart only spends the budget (and the minutes)."""
    exitcode = crash.details["exitcode"]
    return Verdict(
        "crash-loop",
        f"the same failure before the first step in attempts {attempts[0]} and {attempts[1]}: "
        f"a restart cannot help, stopping the job: {crash.text}",
        ranks=crash.ranks,
        step=crash.step,
        details={"exitcode": exitcode, "exit_status": exit_status(exitcode)},
    )


class CrashLoop:
    def __init__(self, policy: WatchPolicy) -> None:
        self.policy = policy
        self._crashes: deque[tuple[float, tuple[int, str]]] = deque()

    def after(self, crash: Verdict, said: str | None, now: float) -> list[Verdict]:
        """A crash verdict was given; said: the words the failure left, if any."""
        exitcode = crash.details["exitcode"]
        words = alike(said)
        self._crashes.append((now, (exitcode, words)))
        while self._crashes and now - self._crashes[0][0] > self.policy.crash_loop_window:
            self._crashes.popleft()
        same = [t for t, (code, said_then) in self._crashes if code == exitcode and same_words(said_then, words)]
        if len(same) < self.policy.crash_loop:
            return []
        self._crashes.clear()
        return [
            Verdict(
                "crash-loop",
                f"the same failure {len(same)} times in {now - same[0]:.0f} s, stopping the job: {crash.text}",
                ranks=crash.ranks,
                step=crash.step,
                details={"exitcode": exitcode, "exit_status": exit_status(exitcode)},
            )
        ]
