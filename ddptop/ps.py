"""`ddptop ps [--json]`: every PyTorch distributed job on this host and its ranks, launched by
ddptop or not, as the operating system shows them (supervisor/outside/discovery.py).

Run on every node of a SLURM job: `srun --overlap --jobid J ddptop ps --json`.
"""

from __future__ import annotations

import json
import shlex

from ddptop.core.format import nbytes
from ddptop.core.usage import OneLineParser

CPU_LOOK_S = 0.5
"""How long each rank's CPU % is measured over: one look, as `top` takes its first."""

NO_STEPS = "step times, loss and grad norm are not seen from outside: `ddptop launch` shows them"


def ps(argv: list[str]) -> int:
    parser = OneLineParser(prog="ddptop ps", description="the PyTorch distributed jobs on this host, and their ranks")
    parser.add_argument("--json", action="store_true", help="one JSON document: a list of jobs, each with its ranks")
    args = parser.parse_args(argv)
    from ddptop.supervisor.outside import looks
    from ddptop.supervisor.outside.discovery import discover

    seen = discover(cpu_interval=CPU_LOOK_S)
    places = looks.each(looks.look, (r.pid for job in seen.jobs for r in job.ranks))  # never pausing a rank
    said = {job.id: looks.verdicts(job, places) for job in seen.jobs}
    if args.json:
        out = []
        for job in seen.jobs:
            shown = job.as_json()
            for rank, entry in zip(job.ranks, shown["ranks"]):
                place = places.get(rank.pid)
                entry["where"] = None if place is None else place.where
                entry["inside"] = None if place is None else place.inside
            shown["verdicts"] = said[job.id]
            out.append(shown)
        print(json.dumps(out, indent=1))
        return 0
    if not seen.jobs:
        print("no PyTorch distributed job runs on this host")
    for job in seen.jobs:
        size = f"{len(job.ranks)} of {job.world_size} ranks" if job.world_size is not None else f"{len(job.ranks)} ranks"
        print(f"job {job.id}: {job.launcher}, {size}: {shlex.join(job.command)}" + (f" (ddptop run {job.run_dir})" if job.run_dir else ""))
        print(f"  {'RANK':>4} {'NODE':>4} {'PID':>8} {'STATE':<10} {'CPU%':>6} {'RSS':>10} {'THREADS':>7}  WHERE")
        for rank in job.ranks:
            cpu = "" if rank.cpu_percent is None else f"{rank.cpu_percent:.0f}"
            node = "" if rank.node is None else str(rank.node)
            threads = "" if rank.threads is None else str(rank.threads)
            place = places.get(rank.pid)
            where = "(not readable)" if place is None else (place.where or "-") + (f" [{place.inside}]" if place.inside else "")
            print(f"  {rank.rank:>4} {node:>4} {rank.pid:>8} {rank.status:<10} {cpu:>6} {nbytes(rank.rss):>10} {threads:>7}  {where}")
        for verdict in said[job.id]:
            print(f"  ! {verdict}")
    if seen.jobs and any(job.launcher != "ddptop" for job in seen.jobs):
        print(f"({NO_STEPS})")
    if seen.unreadable:
        print(
            f"({seen.unreadable} Python processes of other users could not be read: "
            "their ranks and stacks need the same user, or CAP_SYS_PTRACE)"
        )
    return 0
