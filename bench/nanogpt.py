"""What ddptop costs a nanoGPT-sized job: its iteration time under plain torchrun and under ddptop.

Runs bench/gpt_train.py (a GPT of nanoGPT's character-level size, trained
as nanoGPT trains it; see there) alternately under `torchrun` and under
`ddptop launch --headless`, same ranks, iterations and seed, and reports
each side's iteration time (rank 0's, after the warm-up) and the ratio
ddptop/plain: 1.01 is 1% slower under ddptop. Alternating rounds spread the
machine's drift over both sides, but not the spread between processes. On
an H200 host the same plain job took 13.5 ms and then 15.1 ms an iteration
in two rounds. So a few rounds here say whether ddptop costs tens of
percent. For the last percent, run `bench/inrank.py --model gpt`: the same
loop as jobs in one process (docs/benchmarks.md).

    python bench/nanogpt.py --ranks 1 --rounds 3            # on a GPU: the issue's job
    python bench/nanogpt.py --rounds 2 -- --layers 2 --width 64 --heads 2 --batch-size 4 --context 64   # a CPU-sized smoke run

Last, each run's rank 0 as its last round found it: its threads' time on
a CPU and time waiting for one, per iteration, and on a GPU the kernel
time of an iteration against its wall time (gpt_train.py's `sched` and
`gpu-busy-ms` lines).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

from overhead import DDPTOP, alternating, ddptop_commands, device, printed, report, variant
from scratch import scratch_home

JOB = Path(__file__).resolve().parent / "gpt_train.py"
SCHED_SHOWN = 6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=250)
    parser.add_argument(
        "--also", type=variant, action="append", default=[], metavar="LABEL=SPEC", help="another ddptop run (bench/overhead.py)"
    )
    parser.add_argument("job", nargs="*", help="after --: gpt_train.py's own options (its size)")
    args = parser.parse_args()

    job = [str(JOB), "--iters", str(args.iters), *args.job]
    plain = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks), *job]
    with_ddptop = [DDPTOP, "launch", "--headless", "--nproc-per-node", str(args.ranks), *job]
    scratch_home()
    env = dict(os.environ)
    sched: dict[str, dict[str, list[str]]] = {}
    commands = {"plain torchrun": (plain, env), **ddptop_commands(with_ddptop, env, args.also)}
    runs: dict[str, Callable[[], float]] = {}
    for name, (cmd, run_env) in commands.items():
        sched[name] = {"sched ": [], "gpu-busy-ms ": []}
        runs[name] = functools.partial(printed, cmd, run_env, "iter-ms", sched[name])
    results = alternating(args.rounds, runs, unit=" ms")
    print()
    print(
        f"nanoGPT-sized job on {device()}, {args.ranks} rank(s), {args.iters} iterations, {args.rounds} alternating rounds {' '.join(args.job)}"
    )
    report(results, "plain torchrun", "median ms/iter", ".2f", higher_is_faster=False)
    for name, found in sched.items():
        print(f"{name}, rank 0's busiest threads in its last round:")
        for line in found["sched "][:SCHED_SHOWN] + found["gpu-busy-ms "]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
