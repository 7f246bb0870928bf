"""How long a restart takes, from a rank's death to the first step after resume.

The same job (the example, checkpointing every 10 steps) is run alternately
under plain torchrun --max-restarts 1 and under `ddptop launch --headless
--max-restarts 1`; in each, one rank kills itself with SIGKILL at a chosen
step of the first attempt. The example prints the wall time of its death
and of the first step the restarted group finishes, so both sides are
measured by the same clock in the same script:

    python bench/restart.py --ranks 2 --rounds 3

The latency covers torchrun noticing the death, stopping the other ranks,
a new rendezvous, starting the ranks (Python, torch import), joining the
process group, monitor.resume and one step; the bench prints each phase's
median for both sides, so a regression points at its phase. ddptop's first
restart has no backoff, so what differs is its probe, bootstrap and supervisor.

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
import tempfile

from overhead import DDPTOP, EXAMPLE, alternating

DEATH = re.compile(r"injected kill at step \d+, wall ([0-9.]+)")
RESUMED = re.compile(r"first step \d+ of attempt 1 done, wall ([0-9.]+)")
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
    """The wall time of each mark of one restart."""
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    output = result.stdout + result.stderr
    death, resumed, ranks = DEATH.search(output), RESUMED.search(output), TIMELINE.search(output)
    if result.returncode != 0 or death is None or resumed is None or ranks is None:
        sys.exit(f"bench: run failed ({result.returncode}): {' '.join(cmd)}\n{output[-3000:]}")
    marks = {"death": float(death.group(1)), "first step": float(resumed.group(1))}
    for found in AGENT_LINE.finditer(output):
        wall = _agent_wall(*found.groups()[:5])
        for name, text in AGENT_MARKS:
            if name not in marks and text in found.group(6) and wall >= marks["death"] - 0.01:
                marks[name] = wall
    marks.update((name, float(wall)) for name, wall in (pair.split("=") for pair in ranks.group(1).split()))
    return marks


def latency_s(cmd: list[str], env: dict[str, str], phases: list[dict[str, float]]) -> float:
    marks = timeline(cmd, env)
    phases.append({name: marks[end] - marks[start] for name, start, end in PHASES if start in marks and end in marks})
    return marks["first step"] - marks["death"]


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
            tempfile.mkdtemp(prefix=f"ddptop-bench-{name}-"),
            "--inject",
            f"kill@{args.kill_at}:{min(1, args.ranks - 1)}",
        ]

    env = {
        **os.environ,
        "DDPTOP_HOME": tempfile.mkdtemp(prefix="ddptop-bench-"),
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
    }
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    results = alternating(
        args.rounds,
        {name: lambda name=name, command=command: latency_s(command(), env, phases[name]) for name, command in commands.items()},
        " s",
    )

    plain, ours = statistics.median(results["plain torchrun"]), statistics.median(results["ddptop"])
    print()
    print(
        f"restart latency (death of rank 1 at step {args.kill_at} -> first step after resume), "
        f"{args.ranks} ranks, {args.rounds} alternating rounds"
    )
    print(f"{'':<16}{'median s':>10}{'min':>8}{'max':>8}")
    for name, values in results.items():
        print(f"{name:<16}{statistics.median(values):>10.2f}{min(values):>8.2f}{max(values):>8.2f}")
    print(f"ratio ddptop/plain (of medians): {ours / plain:.3f}")
    print()
    print(f"{'where the time went, median s':<56}{'plain':>8}{'ddptop':>8}{'diff':>8}")
    for name, _, _ in PHASES:
        sides = [
            statistics.median(p[name] for p in phases[side] if name in p) if any(name in p for p in phases[side]) else None
            for side in commands
        ]
        text = ["-" if v is None else f"{v:.2f}" for v in sides]
        diff = "-" if None in sides else f"{sides[1] - sides[0]:+.2f}"  # type: ignore[operator]
        print(f"{name:<56}{text[0]:>8}{text[1]:>8}{diff:>8}")


if __name__ == "__main__":
    main()
