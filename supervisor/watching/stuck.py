"""How stall and hang verdicts name the stuck ranks: grouped by what they wait in, where, and after which step.

"ranks 0,1,2 wait in all-reduce at train.py:51 in train_step, after step 199;
rank 3 stuck 25 s in data at data.py:43 in batches, after step 199; rank 4 sent
nothing for 40 s". A rank waits when it is inside a collective (a
torch.distributed call on its stack, or one its flight recorder says it entered
and has not completed: DDP's all-reduce in its backward):
the others it waits for are the ones to look at, so they are named by how
long they have sat still (their stack unchanged, no forward, no busy CPU) and where.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ddptop.core.format import nbytes
from ddptop.core.model.job import JobState
from ddptop.core.model.rank import RankState
from ddptop.core.wire import records
from ddptop.supervisor.watching.liveness import Liveness
from ddptop.supervisor.watching.stacks import process_state
from ddptop.supervisor.watching.verdict import ranks_text


@dataclass(frozen=True)
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
    that names them all, the silent ones (with what the system says of their process and the
    last place they told), the collective each group waits in (in_collectives), and the ranks
    of the world never heard from (Liveness.unheard)."""
    silent = {r: now - seen.heard.get(r, 0.0) for r in ranks if now - seen.heard.get(r, 0.0) > silent_after}
    places = {r: standing(r, state, seen) for r in ranks if r not in silent}
    reports = {r: seen.collectives[r] for r in ranks if r in seen.collectives}
    said = {r: quiet_rank(state.ranks.get(r)) for r in silent}
    text = describe(places, {r: seen.still(r, now) for r in places}, silent, in_collectives(reports), said)
    if unheard := seen.unheard():
        text += f"; {ranks_text(unheard)} never heard from in this attempt"
    # No rank failed (torchrun would have failed the group): one that ended left the rest behind.
    if ended := seen.ended(seen.newest_attempt()):
        text += "; " + ended_early(ended, state, any((r := state.ranks.get(rank)) is not None and r.phase in IN_STEP for rank in places))
    return places, text


IN_STEP = frozenset({"forward", "backward", "optimizer"})
"""The phases of a training step. A rank left in one by a rank that ended was still training
when the other had no batches left; one that waits in its shutdown, or in a collective of its
own after its loop (a last barrier), was not left by uneven inputs."""

UNEVEN = "the ranks ran unequal numbers of steps (uneven inputs: DDP's Join evens them out)"


def ended_early(ended: list[int], state: JobState, training: bool) -> str:
    """The ranks that exited without error while the others went on (Liveness.ended), and
    where training was under way, what that says: the others wait, or fail, in a collective
    that the ended ranks never join."""
    last = max((state.ranks[r].step for r in ended if r in state.ranks), default=-1)
    text = f"{ranks_text(ended)} had exited without error" + (f" after step {last}" if last >= 0 else "")
    return text + (f" while the others trained on: {UNEVEN}" if training else "")


PROCESS_STATES = {
    "T": "stopped by SIGSTOP",
    "t": "stopped by a tracer",
    "D": "in uninterruptible I/O, state D",
    "Z": "a zombie, exited and not reaped",
}
"""What a process's state letter (stacks.process_state) says of a rank that went quiet; a running
or sleeping one says nothing."""


def quiet_rank(rank: RankState | None) -> str:
    """What is known of a rank that sent nothing: its process's state, read here when it runs on
    this host, and the last place of the script's code it told (its WHERE)."""
    if rank is None:
        return ""
    said = []
    if rank.pid and not rank.exited and rank.host == socket.gethostname():
        status = PROCESS_STATES.get(process_state(rank.pid) or "")
        if status is not None:
            said.append(status)
    if rank.where:
        said.append(f"last at {rank.where}")
    return ", ".join(said)


def standing(rank: int, state: JobState, seen: Liveness) -> Standing:
    rank_state = state.ranks.get(rank)
    inside = rank_state.inside if rank_state else None
    phase = rank_state.phase if rank_state else "startup"
    where = rank_state.where if rank_state else None
    done = seen.done.get(rank, -1)
    entered = seen.entered(rank)
    if inside is not None or entered is not None:
        op = entered.get("op") if entered is not None else None
        return Standing(True, (inside or op or "collective").replace("_", "-"), where, done)
    return Standing(False, phase, where, done)


def describe(
    stuck: dict[int, Standing],
    still: dict[int, float],
    silent: dict[int, float],
    collectives: list[str] | None = None,
    said: dict[int, str] | None = None,
) -> str:
    """The verdict's text, the largest group first. still maps a rank to how long it has sat
    still (a group that does not wait says its longest); silent, to how long it has sent nothing,
    said, to what is known of each of those (quiet_rank); collectives, what in_collectives() says
    of the process groups."""
    groups: dict[Standing, list[int]] = {}
    for rank, place in stuck.items():
        groups.setdefault(place, []).append(rank)
    parts = [
        _group(place, ranks, max(still.get(r, 0.0) for r in ranks))
        for place, ranks in sorted(groups.items(), key=lambda item: (-len(item[1]), _order(item[0])))
    ]
    alike: dict[str, list[int]] = {}
    for rank in sorted(silent):
        alike.setdefault((said or {}).get(rank, ""), []).append(rank)
    for what, ranks in alike.items():
        parts.append(f"{ranks_text(ranks)} sent nothing for {max(silent[r] for r in ranks):.0f} s" + (f" ({what})" if what else ""))
    return "; ".join([*parts, *(collectives or [])])


def _order(place: Standing) -> tuple[bool, str, str, int]:
    """Where groups of one size go in the text: a rank not heard from at a place yet (where None)
    sorts with the others, as Standing's own order cannot set None beside a place."""
    return place.waiting, place.what, place.where or "", place.done


def in_collectives(reports: dict[int, list[records.Collective]]) -> list[str]:
    """Per process group that has ranks waiting in a collective: which collective, and who
    never entered it. "default group: ranks 0,1,2 in all_reduce #5512 (25 MB); rank 3 never
    entered it, its last: all_reduce #5511". Sequence numbers count a group's collectives
    the same on every rank, so a rank whose last is behind the others' never issued theirs.
    A rank that told nothing of its collectives (a stopped rank, one holding the GIL in native
    code) is not named here: the verdict says once what it did tell, and for how long it has
    said nothing."""
    groups: dict[str, dict[int, records.Collective]] = {}
    for rank, entries in reports.items():
        for entry in entries:
            groups.setdefault(entry["group"], {})[rank] = entry
    parts = []
    for group in sorted(groups, key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g)):
        told = groups[group]
        top = max(entry["enqueued"] for entry in told.values())
        inside = sorted(r for r, entry in told.items() if entry["enqueued"] == top and entry["completed"] < top)
        if not inside or any(entry["completed"] >= top for entry in told.values()):
            # Nobody waits in this group's collectives: one that completed on any rank was
            # entered by all, and a rank whose recorder has not marked it yet is only behind
            # in telling (gloo marks an entry on its own thread).
            continue
        lead = told[inside[0]]
        size = f" ({nbytes(lead['bytes'])})" if lead.get("bytes") else ""
        text = f"{lead['name']}: {ranks_text(inside)} in {lead.get('op', 'collective')} #{top}{size}"
        behind: dict[str, list[int]] = {}
        for rank, entry in told.items():
            if entry["enqueued"] < top:
                last = f"{entry.get('op', 'collective')} #{entry['enqueued']}" if entry["enqueued"] > 0 else "none yet"
                behind.setdefault(last, []).append(rank)
        for last, lagging in sorted(behind.items(), key=lambda item: min(item[1])):
            text += f"; {ranks_text(lagging)} never entered it, {'its' if len(lagging) == 1 else 'their'} last: {last}"
        parts.append(text)
    return parts


PHASE_WORDS = {"exit": "shutting down", "joined": "out of data under DDP's Join"}
"""The phases whose name does not read after "stuck 30 s" or "last seen": the interpreter's
shutdown (the rank's at-exit), and a rank that ran out of data under DDP's Join."""


def in_phase(phase: str) -> str:
    """Where a phase puts a rank, in words: "in forward", "shutting down"."""
    return PHASE_WORDS.get(phase, f"in {phase}")


def _group(place: Standing, ranks: list[int], still: float) -> str:
    if place.waiting:
        text = f"{ranks_text(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {place.what}"
    else:
        text = f"{ranks_text(ranks)} stuck {still:.0f} s {in_phase(place.what)}"
    if place.where:
        text += f" at {place.where}"
    return text + (", before the first step" if place.done < 0 else f", after step {place.done}")
