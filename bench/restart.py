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
process group, monitor.resume and one step. ddptop's first restart has no
backoff, so what differs is its probe, bootstrap and supervisor.

Plain torchrun runs with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as ddptop
does: without it torch 2.13's restarted gloo groups hang or fail to connect.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from overhead import DDPTOP, EXAMPLE, alternating

DEATH = re.compile(r"injected kill at step \d+, wall ([0-9.]+)")
RESUMED = re.compile(r"first step \d+ of attempt 1 done, wall ([0-9.]+)")


def latency_s(cmd: list[str], env: dict[str, str]) -> float:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    output = result.stdout + result.stderr
    death, resumed = DEATH.search(output), RESUMED.search(output)
    if result.returncode != 0 or death is None or resumed is None:
        sys.exit(f"bench: run failed ({result.returncode}): {' '.join(cmd)}\n{output[-3000:]}")
    return float(resumed.group(1)) - float(death.group(1))


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
    results = alternating(
        args.rounds, {name: lambda command=command: latency_s(command(), env) for name, command in commands.items()}, " s"
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


if __name__ == "__main__":
    main()
