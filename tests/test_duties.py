"""A periodic duty of the supervisor that raises is said once and keeps its schedule (supervisor/duties.py)."""

from __future__ import annotations

import asyncio

from ddptop.supervisor import duties


async def until(condition, deadline_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not condition():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.005)


async def test_a_duty_that_raises_is_reported_once_per_failure_and_keeps_ticking():
    calls: list[int] = []
    said: list[str] = []
    failing = {3, 4, 5, 9}  # two runs of failures, with recovery between

    async def watch() -> None:
        calls.append(len(calls))
        if len(calls) - 1 in failing:
            raise KeyError(f"rank {len(calls) - 1}")

    task = asyncio.create_task(duties.every(0.005, "watchdog", watch, said.append))
    try:
        await until(lambda: len(calls) >= 12)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert said == [
        "the supervisor's watchdog failed (KeyError: 'rank 3'); it goes on trying every 0.005 s",
        "the supervisor's watchdog failed (KeyError: 'rank 9'); it goes on trying every 0.005 s",
    ]
    assert task.cancelled(), "cancelling still ends it"
