"""Many ranks' stacks read at once: those that read alike told once, with their ranks.

`ddptop stacks PID` prints them so in a shell, and the dashboard's stacks
screen shows them so: 64 ranks waiting in one all-reduce are one stack, and
the one rank elsewhere stands apart.
"""

from __future__ import annotations

import re

UNREADABLE = "(py-spy could not read it: the same user, or CAP_SYS_PTRACE, is needed; or it is gone)"
"""What stands for a rank's stack that py-spy could not read."""


def ranks_span(ranks: list[int]) -> str:
    """ "rank 3", or "ranks 0-2,4-7": runs of ranks as ranges, for a stack many ranks share."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    text = ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
    return ("rank " if len(ranks) == 1 else "ranks ") + text


_PROCESS_LINES = re.compile(r"^(Process \d+:|Python v)")
_THREAD_ID = re.compile(r"^Thread (0x[0-9A-Fa-f]+|\d+) ")


def grouped(dumps: dict[int, str | None]) -> list[tuple[list[int], str]]:
    """Ranks' dumps grouped where they read alike but for the process's own numbers (its pid, its
    threads' ids): the largest group first, then the odd ones; an unreadable rank is a group of its own."""
    groups: dict[str, list[int]] = {}
    for rank, text in dumps.items():
        if text is None:
            key = UNREADABLE
        else:
            lines = [_THREAD_ID.sub("Thread ", line) for line in text.splitlines() if not _PROCESS_LINES.match(line)]
            key = "\n".join(lines).strip("\n")
        groups.setdefault(key, []).append(rank)
    return sorted(((ranks, text) for text, ranks in groups.items()), key=lambda item: (-len(item[0]), min(item[0])))
