"""What looks at a job ddptop did not launch say over time, each said once with its evidence.

One look (looks.verdicts) sees a stopped rank or an odd rank out; a watch
that keeps looking also knows for how long: a rank in uninterruptible I/O
for a while rather than a moment, the odd rank's time in its own frame, a
whole job that sits in one frame using no CPU, a rank whose memory only
grows. Each verdict is said when it starts, once, and again only after the
rank has left that state.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from ddptop.core.format import nbytes
from ddptop.core.stack_groups import ranks_span
from ddptop.supervisor.outside.discovery import Job, Rank
from ddptop.supervisor.outside.looks import STATE_WORDS, Place, odd_out

DISK_WAIT_S = 10.0
"""A rank in state D this long is stuck in I/O (a hung NFS server), not reading a file."""
STALLED_S = 15.0
"""Every rank in the same frame, using no CPU, this long: the job is stalled."""
IDLE_CPU = 5.0
"""CPU % under which a rank does no work of its own."""
ODD_S = 2.0
"""How long one rank stays elsewhere while the others wait in a collective before it is named:
a look can catch a rank on its way into the collective the others are in."""
MEMORY_SAMPLES = 10
"""Readings, one per look, over which a rank's memory must only have grown."""
MEMORY_GROWTH = 0.2
MEMORY_MIN_BYTES = 256 << 20
"""How much it must have grown, as a share of where it started and in bytes, to be named."""


@dataclass
class Verdict:
    kind: str
    ranks: list[int]
    text: str


@dataclass
class _Seen:
    """One rank as the looks so far found it."""

    rank: int
    state: str = ""
    state_since: float = 0.0
    place: tuple[str | None, str | None] | None = None
    place_since: float = 0.0
    rss: deque[int] = field(default_factory=lambda: deque(maxlen=MEMORY_SAMPLES))


class Judge:
    """Fed each look at one job: its ranks (states, CPU, memory) and their places."""

    def __init__(self) -> None:
        self._seen: dict[int, _Seen] = {}
        """pid -> what the looks found of that rank."""
        self._said: set[tuple[object, ...]] = set()

    def observe(self, job: Job, places: dict[int, Place | None], now: float) -> list[Verdict]:
        ranks = {r.pid: r for r in job.ranks}
        said: list[Verdict] = []
        for pid in sorted(set(self._seen) - set(ranks)):
            gone = self._seen.pop(pid)
            if ranks and self._say(("gone", pid)):
                said.append(Verdict("gone", [gone.rank], f"rank {gone.rank} (pid {pid}) is gone while {_span(job.ranks)} run"))
        for rank in job.ranks:
            seen = self._seen.setdefault(rank.pid, _Seen(rank.rank, rank.status, now))
            if rank.status != seen.state:
                self._unsay(rank.pid, seen.state)
                seen.state, seen.state_since = rank.status, now
            place = places.get(rank.pid)
            if place is not None and (place.where, place.inside) != seen.place:
                seen.place, seen.place_since = (place.where, place.inside), now
            if rank.rss is not None:
                seen.rss.append(rank.rss)
            said += self._states(rank, seen, now)
        said += self._odd_out(job, now)
        said += self._stalled(job, now)
        return said

    def since(self, pid: int) -> float | None:
        """When the rank went where the looks last found it; None before they found it anywhere."""
        seen = self._seen.get(pid)
        return None if seen is None or seen.place is None else seen.place_since

    def _states(self, rank: Rank, seen: _Seen, now: float) -> list[Verdict]:
        held = now - seen.state_since
        if rank.status in ("stopped", "tracing-stop") and self._say((rank.status, rank.pid)):
            return [Verdict("stopped", [rank.rank], f"rank {rank.rank} (pid {rank.pid}) is {STATE_WORDS[rank.status]}")]
        if rank.status == "disk-sleep" and held >= DISK_WAIT_S and self._say((rank.status, rank.pid)):
            return [
                Verdict(
                    "disk", [rank.rank], f"rank {rank.rank} (pid {rank.pid}) has been in uninterruptible I/O (state D) for {held:.0f} s"
                )
            ]
        if rank.status == "zombie" and self._say((rank.status, rank.pid)):
            return [Verdict("zombie", [rank.rank], f"rank {rank.rank} (pid {rank.pid}) is {STATE_WORDS[rank.status]}")]
        grew = list(seen.rss)
        if len(grew) == MEMORY_SAMPLES and all(b >= a for a, b in itertools.pairwise(grew)):
            more = grew[-1] - grew[0]
            if more >= MEMORY_MIN_BYTES and more >= MEMORY_GROWTH * grew[0] and self._say(("memory", rank.pid)):
                text = f"rank {rank.rank}'s memory keeps growing: {nbytes(grew[0])} to {nbytes(grew[-1])} over its last {MEMORY_SAMPLES} readings"
                return [Verdict("memory", [rank.rank], text)]
        return []

    def _odd_out(self, job: Job, now: float) -> list[Verdict]:
        """One rank (or a few) elsewhere while at least two wait in a collective."""
        placed = {r.rank: (s, s.place) for r in job.ranks if (s := self._seen[r.pid]).place is not None}
        split = odd_out({rank: place[1] for rank, (_, place) in placed.items() if place is not None})
        if split is None:
            return []
        waiting, odd = split
        since = min(placed[rank][0].place_since for rank in waiting)
        where, inside = placed[waiting[0]][1] or (None, None)
        said = []
        for rank in odd:
            seen = placed[rank][0]
            held = now - seen.place_since
            odd_where = (seen.place or (None, None))[0] or "library code"
            if held >= ODD_S and self._say(("odd", rank, odd_where)):
                text = (
                    f"rank {rank} in {odd_where} for {held:.0f} s; {ranks_span(sorted(waiting))} in {inside}"
                    + (f" ({where})" if where else "")
                    + f" for {now - since:.0f} s"
                )
                said.append(Verdict("odd_rank_out", [rank], text))
        return said

    def _stalled(self, job: Job, now: float) -> list[Verdict]:
        """Every rank in one frame, none using CPU, for STALLED_S."""
        seen = [self._seen[r.pid] for r in job.ranks]
        places = {s.place for s in seen}
        if len(job.ranks) < 2 or len(places) != 1 or None in places:
            return []
        if any(r.cpu_percent is None or r.cpu_percent >= IDLE_CPU for r in job.ranks):
            return []
        held = now - max(s.place_since for s in seen)
        where, inside = next(iter(places)) or (None, None)
        frame = where or inside or "library code"
        if held < STALLED_S or not self._say(("stalled", frame)):
            return []
        return [
            Verdict(
                "stalled",
                [r.rank for r in job.ranks],
                f"the job is stalled: every rank at {frame}"
                + (f" in {inside}" if inside and where else "")
                + f" for {held:.0f} s, using no CPU",
            )
        ]

    def _say(self, key: tuple[object, ...]) -> bool:
        if key in self._said:
            return False
        self._said.add(key)
        return True

    def _unsay(self, pid: int, state: str) -> None:
        """A rank that left a state may be told of again when it next enters it."""
        self._said.discard((state, pid))


def _span(ranks: list[Rank]) -> str:
    return ranks_span([r.rank for r in ranks])
