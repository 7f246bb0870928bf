"""How long a restart takes, from a rank's death to the first step after resume,
and how long the first start takes, from the launch to the first step.

The same job (the example, checkpointing every 10 steps) is run alternately
under plain torchrun --max-restarts 1, under `ddptop launch --headless
--max-restarts 1` (ranks forked from its template, trainer/template) and
under the same with --no-template (ranks started as torchrun starts them);
in each, one rank kills itself with SIGKILL at a chosen step of the first
attempt. The example prints the wall time of its death and of the first
step of each attempt, so every side is measured by the same clock in the
same script:

    python bench/restart.py --ranks 2 --rounds 5

The latency covers torchrun noticing the death, stopping the other ranks,
a new rendezvous, starting the ranks (Python, torch import), joining the
process group, monitor.resume and one step; the bench prints each phase's
median for every side, so a regression points at its phase. ddptop's first
restart has no backoff, so what differs is its probe, bootstrap, template
and supervisor.

Plain torchrun runs with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as ddptop
does: without it torch 2.13's restarted gloo groups hang or fail to connect.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time

from overhead import DDPTOP, EXAMPLE, alternating
from scratch import scratch_folder, scratch_home

DEATH = re.compile(r"injected kill at step \d+, wall ([0-9.]+)")
RESUMED = re.compile(r"first step \d+ of attempt 1 done, wall ([0-9.]+)")
FIRST = re.compile(r"first step \d+ of attempt 0 done, wall ([0-9.]+)")
TIMELINE = re.compile(r"restart timeline (.*)$", re.M)
AGENT_LINE = re.compile(r"^(?:\[[^\]]*\]:)?[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) \d+ \S+\] (.*)$", re.M)
AGENT_MARKS = (
    ("noticed", "closing signal"),  # the agent saw the death and stops the others
    ("stopped", "Worker group FAILED"),  # the others are down; the agent decides to restart
    ("released", "Stopping worker group"),  # the restart goes ahead (ddptop's probe holds it until the failure is judged)
    ("rendezvous", "Rendezvous complete"),
)
PHASES = (
    ("agent notices the death", "death", "noticed"),
    ("the other ranks stop", "noticed", "stopped"),
    ("the failure is judged (ddptop's hold)", "stopped", "released"),
    ("rendezvous", "released", "rendezvous"),
    ("interpreter and bootstrap, to the script's first line", "rendezvous", "script"),
    ("import torch (and ddptop's hooks)", "script", "torch"),
    ("init_process_group", "torch", "group"),
    ("model, monitor.resume", "group", "resumed"),
    ("the first step", "resumed", "first step"),
)
"""A restart's phases, each from one mark to the next: the agent's from torchrun's own log
lines (LOGLEVEL=INFO), the rest from rank 0 of the restarted group (examples/train.py)."""


def _agent_wall(month: str, day: str, hour: str, minute: str, second: str) -> float:
    """torchrun's glog-style stamp (local time, no year) as a Unix time."""
    now = datetime.datetime.now()
    return datetime.datetime(now.year, int(month), int(day), int(hour), int(minute)).timestamp() + float(second)


def timeline(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """The wall time of each mark of one run: its launch, its first step, and its restart's marks."""
    launch = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    output = result.stdout + result.stderr
    death, resumed, ranks, first = DEATH.search(output), RESUMED.search(output), TIMELINE.search(output), FIRST.search(output)
    if result.returncode != 0 or death is None or resumed is None or ranks is None or first is None:
        sys.exit(f"bench: run failed ({result.returncode}): {' '.join(cmd)}\n{output[-3000:]}")
    marks = {"launch": launch, "started": float(first.group(1)), "death": float(death.group(1)), "first step": float(resumed.group(1))}
    for found in AGENT_LINE.finditer(output):
        wall = _agent_wall(*found.groups()[:5])
        for name, text in AGENT_MARKS:
            if name not in marks and text in found.group(6) and wall >= marks["death"] - 0.01:
                marks[name] = wall
    marks.update((name, float(wall)) for name, wall in (pair.split("=") for pair in ranks.group(1).split()))
    return marks


def latency_s(cmd: list[str], env: dict[str, str], phases: list[dict[str, float]], first_starts: list[float]) -> float:
    """The restart's latency; its phases and the run's first start go to the lists given."""
    marks = timeline(cmd, env)
    phases.append({name: marks[end] - marks[start] for name, start, end in PHASES if start in marks and end in marks})
    first_starts.append(marks["started"] - marks["launch"])
    return marks["first step"] - marks["death"]


def table(title: str, results: dict[str, list[float]]) -> None:
    plain = statistics.median(results["plain torchrun"])
    print(title)
    print(f"{'':<22}{'median s':>10}{'min':>8}{'max':>8}{'/ plain':>9}")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<22}{median:>10.2f}{min(values):>8.2f}{max(values):>8.2f}{median / plain:>9.3f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=45, help="step at which rank 1 dies in the first attempt")
    args = parser.parse_args()

    def job(name: str) -> list[str]:
        return [
            str(EXAMPLE),
            "--steps",
            str(args.kill_at + 20),
            "--checkpoint-every",
            "10",
            "--checkpoint-dir",
            scratch_folder(f"ddptop-bench-{name}-"),
            "--inject",
            f"kill@{args.kill_at}:{min(1, args.ranks - 1)}",
        ]

    scratch_home()
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "LOGLEVEL": "INFO",  # torchrun's own log lines mark the agent's phases
    }
    commands = {
        "plain torchrun": lambda: [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(args.ranks),
            "--max-restarts",
            "1",
            *job("plain"),
        ],
        "ddptop": lambda: [DDPTOP, "launch", "--headless", "--nproc-per-node", str(args.ranks), "--max-restarts", "1", *job("ddptop")],
        "ddptop --no-template": lambda: [
            DDPTOP,
            "launch",
            "--headless",
            "--no-template",
            "--nproc-per-node",
            str(args.ranks),
            "--max-restarts",
            "1",
            *job("plainddptop"),
        ],
    }
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    first_starts: dict[str, list[float]] = {name: [] for name in commands}
    results = alternating(
        args.rounds,
        {
            name: lambda name=name, command=command: latency_s(command(), env, phases[name], first_starts[name])
            for name, command in commands.items()
        },
        " s",
    )

    print()
    where = f"{args.ranks} ranks, {args.rounds} alternating rounds, {os.cpu_count()} cores"
    table(f"restart latency (death of rank 1 at step {args.kill_at} -> first step after resume), {where}", results)
    table(f"first start (launch -> first step), {where}", first_starts)
    print(f"{'where the restart went, median s':<56}" + "".join(f"{name[:14]:>16}" for name in commands))
    for name, _, _ in PHASES:
        sides = [
            statistics.median(p[name] for p in phases[side] if name in p) if any(name in p for p in phases[side]) else None
            for side in commands
        ]
        print(f"{name:<56}" + "".join(f"{'-' if v is None else f'{v:.2f}':>16}" for v in sides))


if __name__ == "__main__":
    main()
