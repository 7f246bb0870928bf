"""The supervisor's periodic duties, each on its own schedule and each unable to end unseen.

A duty (sample the ranks, judge them, flush the log, save the state) runs
every period from start to start. One that raises is not allowed to end its
task, which would leave the job running unwatched with no word: the failure
is reported once, with the exception, and the duty keeps its schedule; if it
recovers and fails again later, that is reported again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


def failure_text(name: str, exc: BaseException, period: float) -> str:
    """What a dashboard and the log say of a duty that raised."""
    return f"the supervisor's {name} failed ({type(exc).__name__}: {exc}); it goes on trying every {period:g} s"


async def every(period: float, name: str, action: Callable[[], Awaitable[None]], failed: Callable[[str], None]) -> None:
    """Call action every period seconds until cancelled; failed(text) once a failure begins."""
    loop = asyncio.get_running_loop()
    next_at = loop.time() + period
    failing = False
    while True:
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        next_at += period
        try:
            await action()
        except Exception as exc:  # noqa: BLE001  # any bug of a duty must not end the watching; CancelledError is not an Exception
            if not failing:
                failed(failure_text(name, exc, period))
            failing = True
        else:
            failing = False
