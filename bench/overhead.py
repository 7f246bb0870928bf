"""What ddptop's instrumentation costs a training job, measured side by side.

Runs the example job alternately under plain torchrun and under `ddptop
launch --headless` (same script, ranks, steps and seed), reads the steps/s
that rank 0 measured after warm-up, and reports each configuration's median
and the ratio ddptop/plain. Alternating rounds spread the machine's drift
over both sides equally.

    python bench/overhead.py --ranks 2 --steps 2000 --rounds 5
    python bench/overhead.py --clip-grad 1.0 --desync-every 10   # the watchdog's checks on
    python bench/overhead.py --on-nan skip     # on CUDA: the exact skip's synchronisation
    python bench/overhead.py --also fr-off=TORCH_FR_BUFFER_SIZE=0 --also forked=--no-template

`--also LABEL=SPEC` adds a ddptop run to each round: SPEC's leading
NAME=VALUE words go into its environment, the rest are `ddptop launch`
options. Each is reported against the same rounds' plain runs: what part
of ddptop's cost a variable or an option accounts for.

ddptop's NaN/Inf guard runs on every step in every configuration (it is
the default); --clip-grad and --desync-every add enforced clipping and
parameter checksums.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from scratch import scratch_home

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train.py"
DDPTOP = str(Path(sys.executable).parent / "ddptop")


def printed(cmd: list[str], env: dict[str, str], name: str, lines: dict[str, list[str]] | None = None) -> float:
    """The figure a run printed after `name` ("train-steps-per-s 512.3"); a run that failed ends the bench.
    With lines, the run's lines that begin with one of its keys replace that key's list."""
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    said = [re.sub(r"^\[rank\d+\]:", "", line) for line in result.stdout.splitlines()]  # torchrun's prefix under ddptop
    for prefix in lines or {}:
        lines[prefix] = [line for line in said if line.startswith(prefix)]  # type: ignore[index]
    match = re.search(rf"{re.escape(name)} ([0-9.]+)", result.stdout)
    if result.returncode != 0 or match is None:
        sys.exit(f"bench: run failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-2000:]}")
    return float(match.group(1))


def alternating(rounds: int, runs: Mapping[str, Callable[[], float]], unit: str = "") -> dict[str, list[float]]:
    """Each run's figures over rounds, in alternating order so that the
    machine's drift falls on both sides equally; a line per round."""
    results: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(rounds):
        order = list(runs.items())
        if round_ % 2:
            order.reverse()
        for name, run in order:
            results[name].append(run())
        print(f"round {round_ + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.3f}{unit}" for k, v in results.items()), flush=True)
    return results


def variant(text: str) -> tuple[str, dict[str, str], list[str]]:
    """`--also LABEL=SPEC`: the label, the environment SPEC sets, and its ddptop options."""
    label, sep, spec = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"{text!r} is not LABEL=SPEC")
    words = shlex.split(spec)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return label, env, words


def ddptop_commands(
    with_ddptop: list[str], env: dict[str, str], also: list[tuple[str, dict[str, str], list[str]]]
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """ddptop's run and each `--also` variant's, by name: its command (the variant's options after
    `ddptop launch --headless`) and its environment."""
    commands = {"ddptop": (with_ddptop, env)}
    for label, extra_env, options in also:
        commands[f"ddptop {label}"] = ([*with_ddptop[:3], *options, *with_ddptop[3:]], {**env, **extra_env})
    return commands


def report(results: dict[str, list[float]], base: str, what: str, fmt: str, higher_is_faster: bool) -> None:
    """Each run's median, min and max, and each ddptop run's ratio to the plain runs of the same rounds."""
    print(f"{'':<24}{what:>16}{'min':>10}{'max':>10}")
    for name, values in results.items():
        print(f"{name:<24}{statistics.median(values):>16{fmt}}{min(values):>10{fmt}}{max(values):>10{fmt}}")
    plain = results[base]
    for name, values in results.items():
        if name == base:
            continue
        ratios = [d / p for d, p in zip(values, plain)]
        kind = "" if higher_is_faster else " iteration time"
        print(
            f"ratio {name}/plain{kind} (of medians): {statistics.median(values) / statistics.median(plain):.3f}; "
            "per-round ratios: " + " ".join(f"{r:.3f}" for r in ratios)
        )


def device() -> str:
    """What the ranks train on: the example uses CUDA whenever torch sees a GPU."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (gloo)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=256, help="MLP width of the example job")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--clip-grad", type=float, help="ddptop enforces this grad norm")
    parser.add_argument("--on-nan", help="ddptop's NaN policy (its default: auto, which never synchronises on CUDA)")
    parser.add_argument("--desync-every", type=int, default=100, help="steps between ddptop's parameter checksums (its default: 100)")
    parser.add_argument("--also", type=variant, action="append", default=[], metavar="LABEL=SPEC", help="another ddptop run (see above)")
    args = parser.parse_args()

    job = [str(EXAMPLE), "--steps", str(args.steps), "--width", str(args.width), "--batch-size", str(args.batch_size)]
    plain = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks), *job]
    scratch_home()
    env = dict(os.environ)
    checks = ["--desync-every", str(args.desync_every)]
    if args.clip_grad is not None:
        checks += ["--clip-grad", str(args.clip_grad)]
    if args.on_nan is not None:
        checks += ["--on-nan", args.on_nan]
    with_ddptop = [DDPTOP, "launch", "--headless", "--nproc-per-node", str(args.ranks), *checks, *job]

    on = device()  # before the rounds, so the summary follows the last one at once: a time limit cut it while torch imported
    commands = {"plain torchrun": (plain, env), **ddptop_commands(with_ddptop, env, args.also)}
    runs = {name: functools.partial(printed, cmd, run_env, "train-steps-per-s") for name, (cmd, run_env) in commands.items()}
    results = alternating(args.rounds, runs)
    print()
    print(
        f"example job on {on}, {args.ranks} ranks, {args.steps} steps, width {args.width}, batch {args.batch_size}, "
        f"{args.rounds} alternating rounds; ddptop {' '.join(checks)}"
    )
    report(results, "plain torchrun", "median steps/s", ".1f", higher_is_faster=True)


if __name__ == "__main__":
    main()
