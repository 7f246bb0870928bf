"""Where a rank's GPU memory is measured: the CUDA caching allocator's counters.

Reading them costs host time, not a synchronisation: the allocator builds
its whole statistics dictionary for every call (torch.cuda.memory_allocated()
and its siblings each flatten and sort it again). At a step of 1.5 ms that
is a visible share, while the figures move slowly and the dashboard redraws
a few times a second. So a rank reads them at most every READ_EVERY_S, and
the steps in between carry the last reading. The peak is the allocator's
own high-water mark, so no peak between two readings is missed.

Like hooks.py, the only module that uses it, this imports torch at the top:
it is reached only once the script has imported torch itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

READ_EVERY_S = 0.1


def read_allocator() -> dict[str, int]:
    """This device's allocated, reserved and peak bytes; {} before CUDA is used."""
    if not torch.cuda.is_initialized():
        return {}
    stats = torch.cuda.memory_stats_as_nested_dict()
    if not stats:
        return {}
    allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
    return {"mem_alloc": allocated["current"], "mem_reserved": reserved["current"], "mem_peak": allocated["peak"]}


class MemoryReadings:
    """The latest reading for each step's record, refreshed at most every `every` seconds.

    A reading that came back empty (CUDA not used yet) is retried at the
    next step, so the first step that uses the GPU has its figures.
    """

    def __init__(
        self,
        read: Callable[[], dict[str, int]] = read_allocator,
        clock: Callable[[], float] = time.monotonic,
        every: float = READ_EVERY_S,
    ) -> None:
        self._read = read
        self._clock = clock
        self._every = every
        self._next = 0.0
        self._last: dict[str, int] = {}

    def get(self) -> dict[str, int]:
        """A fresh dict: the caller adds the step's other values to it."""
        now = self._clock()
        if not self._last or now >= self._next:
            self._last = self._read()
            self._next = now + self._every
        return dict(self._last) if self._last else {}
