"""What ddptop costs a nanoGPT-sized job: its iteration time under plain torchrun and under ddptop.

Runs bench/gpt_train.py (a GPT of nanoGPT's character-level size, trained
as nanoGPT trains it; see there) alternately under `torchrun` and under
`ddptop launch --headless`, same ranks, iterations and seed, and reports
each side's iteration time (rank 0's, after the warm-up) and the ratio
ddptop/plain: 1.01 is 1% slower under ddptop. Alternating rounds spread the
machine's drift over both sides.

    python bench/nanogpt.py --ranks 1 --rounds 3            # on a GPU: the issue's job
    python bench/nanogpt.py --rounds 2 -- --layers 2 --width 64 --batch-size 4 --context 64   # a CPU-sized smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from overhead import DDPTOP, alternating, device, printed

JOB = Path(__file__).resolve().parent / "gpt_train.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=250)
    parser.add_argument("job", nargs="*", help="after --: gpt_train.py's own options (its size)")
    args = parser.parse_args()

    job = [str(JOB), "--iters", str(args.iters), *args.job]
    plain = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks), *job]
    with_ddptop = [DDPTOP, "launch", "--headless", "--nproc-per-node", str(args.ranks), *job]
    env = {**os.environ, "DDPTOP_HOME": tempfile.mkdtemp(prefix="ddptop-bench-")}
    results = alternating(
        args.rounds,
        {"plain torchrun": lambda: printed(plain, env, "iter-ms"), "ddptop": lambda: printed(with_ddptop, env, "iter-ms")},
        unit=" ms",
    )
    plain_ms, ddptop_ms = statistics.median(results["plain torchrun"]), statistics.median(results["ddptop"])
    ratios = [d / p for d, p in zip(results["ddptop"], results["plain torchrun"])]
    print()
    print(
        f"nanoGPT-sized job on {device()}, {args.ranks} rank(s), {args.iters} iterations, {args.rounds} alternating rounds {' '.join(args.job)}"
    )
    print(f"{'':<16}{'median ms/iter':>16}{'min':>10}{'max':>10}")
    for name, values in results.items():
        print(f"{name:<16}{statistics.median(values):>16.2f}{min(values):>10.2f}{max(values):>10.2f}")
    print(
        f"ratio ddptop/plain iteration time (of medians): {ddptop_ms / plain_ms:.3f}; per-round ratios: "
        + " ".join(f"{r:.3f}" for r in ratios)
    )


if __name__ == "__main__":
    main()
