"""How stall and hang verdicts name the stuck ranks: grouped by what they wait in, where, and after which step.

"ranks 0,1,2 wait in all-reduce at train.py:51 in train_step, after step 199;
rank 3 stuck 25 s in data at data.py:43 in batches, after step 199; rank 4 sent
nothing for 40 s". A rank waits when it is inside a collective (a
torch.distributed call on its stack, or DDP's all-reduce in its backward):
the others it waits for are the ones to look at, so they are named by how
long they have sat still (their stack unchanged, no forward) and where.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddptop.core.model.job import JobState
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.verdict import ranks_text


@dataclass(frozen=True, order=True)
class Standing:
    """Where one stuck rank stands, as the text groups it."""

    waiting: bool
    what: str
    """The collective it waits in, else the phase of its step it sits in (data, forward...)."""
    where: str | None
    done: int
    """The last step it finished; -1 before its first."""


def named(ranks: list[int], state: JobState, seen: Liveness, now: float, silent_after: float) -> tuple[dict[int, Standing], str]:
    """Where each of ranks stands (those heard from in the last silent_after seconds), and the text
    that names them all, the silent ones and any lag the flight recorder shows."""
    silent = {r: now - seen.heard.get(r, 0.0) for r in ranks if now - seen.heard.get(r, 0.0) > silent_after}
    places = {r: standing(r, state, seen) for r in ranks if r not in silent}
    return places, describe(places, {r: seen.still(r, now) for r in places}, silent, seen.collectives)


def standing(rank: int, state: JobState, seen: Liveness) -> Standing:
    rank_state = state.ranks.get(rank)
    inside = rank_state.inside if rank_state else None
    phase = rank_state.phase if rank_state else "startup"
    where = rank_state.where if rank_state else None
    done = seen.done.get(rank, -1)
    if inside is not None or phase == "comm":
        return Standing(True, (inside or "all_reduce").replace("_", "-"), where, done)
    return Standing(False, phase, where, done)


def describe(
    stuck: dict[int, Standing], still: dict[int, float], silent: dict[int, float], collectives: dict[int, int] | None = None
) -> str:
    """The verdict's text, the largest group first. still maps a rank to how long it has sat
    still (a group that does not wait says its longest); silent, to how long it has sent nothing;
    collectives, to the last collective it enqueued (lag())."""
    groups: dict[Standing, list[int]] = {}
    for rank, place in stuck.items():
        groups.setdefault(place, []).append(rank)
    parts = [
        _group(place, ranks, max(still.get(r, 0.0) for r in ranks))
        for place, ranks in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    ]
    if silent:
        parts.append(f"{ranks_text(sorted(silent))} sent nothing for {max(silent.values()):.0f} s")
    if collectives and (lagging := lag(collectives)):
        parts.append(lagging)
    return "; ".join(parts)


def lag(collectives: dict[int, int]) -> str | None:
    """Which ranks' collectives lag, as the flight recorder counts them: "rank 3 enqueued
    collective 57 last, ranks 0,1,2 58". The ranks behind never issued the collective the
    others wait in. None when fewer than two ranks told, or all agree."""
    if len(collectives) < 2 or len(set(collectives.values())) < 2:
        return None
    behind = min(collectives.values())
    lagging = sorted(r for r, seq in collectives.items() if seq == behind)
    ahead = {seq: sorted(r for r, s in collectives.items() if s == seq) for seq in set(collectives.values()) if seq != behind}
    others = ", ".join(f"{ranks_text(ranks)} {seq}" for seq, ranks in sorted(ahead.items()))
    return f"flight recorder: {ranks_text(lagging)} enqueued collective {behind} last, {others}"


def _group(place: Standing, ranks: list[int], still: float) -> str:
    if place.waiting:
        text = f"{ranks_text(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {place.what}"
    else:
        text = f"{ranks_text(ranks)} stuck {still:.0f} s in {place.what}"
    if place.where:
        text += f" at {place.where}"
    return text + (", before the first step" if place.done < 0 else f", after step {place.done}")
