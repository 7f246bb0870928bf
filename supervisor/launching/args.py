"""Splitting `ddptop launch` arguments into ddptop's, torchrun's and the script's.

Users write `ddptop launch train.py --gpus 4 --lr 3e-4`. Before the script
every option is ddptop's (torchrun's spellings included), and one it does
not know is a mistake. After the script an option is the script's whenever
the script declares it (script_options.py reads its source): ddptop takes
only its own options that the script does not declare, and says in one
line what it left. Everything after `--` is the script's.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddptop.core.policy import (
    CRASH_LOOP,
    CRASH_LOOP_WINDOW_S,
    DESYNC_EVERY,
    HANG_TIMEOUT_S,
    NO_PROGRESS,
    ON_DESYNC,
    ON_HANG,
    ON_NAN,
    OnDesync,
    OnHang,
    OnNan,
)
from ddptop.core.usage import OneLineParser, UsageError
from ddptop.supervisor.launching.script_options import declared_by
from ddptop.supervisor.launching.style import STYLES, StyleChoice
from ddptop.supervisor.launching.torchrun import RESTART_BACKOFF_S


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError
    return value


_positive_int.__name__ = "positive integer"
_non_negative_int.__name__ = "non-negative integer"
_positive_float.__name__ = "positive number"
_non_negative_float.__name__ = "non-negative number"

SUMMARY_EVERY_S = 5.0
"""Seconds between the summary lines a headless supervisor prints."""

# (spellings, argparse keyword arguments); the first spelling names the dest.
OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--gpus",), {"type": _positive_int, "help": "ranks on this node, one GPU each (CPU ranks on gloo without a GPU)"}),
    (("--nproc-per-node", "--nproc_per_node"), {"type": _positive_int, "help": "ranks on this node (torchrun's spelling)"}),
    (
        ("--launch-style",),
        {
            "choices": STYLES,
            "help": "how the script starts its ranks: torchrun (one copy per GPU), spawn (the script starts them itself), single (one process, nn.DataParallel); auto (default) reads the script",
        },
    ),
    (("--nnodes",), {"help": "number of nodes, or MIN:MAX"}),
    (("--node-rank", "--node_rank"), {"type": _non_negative_int, "help": "this node's rank"}),
    (("--rdzv-endpoint", "--rdzv_endpoint"), {"help": "HOST:PORT of the rendezvous"}),
    (("--rdzv-backend", "--rdzv_backend"), {"help": "rendezvous backend (default c10d)"}),
    (("--rdzv-id", "--rdzv_id"), {"help": "job id shared by all nodes"}),
    (("--aggregator",), {"help": "HOST:PORT of node 0's supervisor, for the other nodes (default: the rendezvous host, its port + 1)"}),
    (
        ("--join-timeout",),
        {"type": _positive_float, "help": "seconds a node waits for node 0's supervisor to answer (default 120)"},
    ),
    (("--listen",), {"help": "[ADDR:]PORT: serve dashboards over TCP here too, with the run's token (ADDR defaults to 127.0.0.1)"}),
    (("--token-file",), {"type": Path, "help": "the job's token for TCP (default: $DDPTOP_TOKEN, else a new one in the run directory)"}),
    (("--prometheus",), {"help": "[ADDR:]PORT: Prometheus metrics over HTTP (ADDR defaults to 127.0.0.1)"}),
    (
        ("--max-restarts", "--max_restarts"),
        {"type": _non_negative_int, "help": "restarts of the worker group torchrun may make (default 3)"},
    ),
    (
        ("--restart-backoff",),
        {
            "type": _non_negative_float,
            "help": f"seconds before the 2nd restart, doubling for each after (the 1st is at once; default {RESTART_BACKOFF_S:g}; 0: no waits)",
        },
    ),
    (
        ("--crash-loop",),
        {
            "type": _positive_int,
            "help": f"stop the job when the same failure happens this many times (default {CRASH_LOOP})",
        },
    ),
    (
        ("--crash-loop-window",),
        {
            "type": _positive_float,
            "help": f"... within this many seconds (default {CRASH_LOOP_WINDOW_S:.0f})",
        },
    ),
    (
        ("--no-progress",),
        {
            "type": _non_negative_int,
            "help": f"stop the job after this many attempts in a row that got no further than the ones before (default {NO_PROGRESS}; 0: off)",
        },
    ),
    (
        ("--no-template",),
        {
            "action": "store_true",
            "help": "start each rank as torchrun does (a new Python that imports torch), not forked from a process that has imported torch once",
        },
    ),
    (("--headless",), {"action": "store_true", "help": "no dashboard: summaries on stdout, alerts on stderr"}),
    (("--run-dir",), {"type": Path, "help": "the run directory (default: a new one under ~/.local/state/ddptop/runs)"}),
    (("--summary-every",), {"type": _positive_float, "help": f"seconds between headless summary lines (default {SUMMARY_EVERY_S:g})"}),
    (
        ("--on-nan",),
        {
            "choices": ON_NAN,
            "help": "a step with NaN/Inf loss or gradients: skip it on all ranks, restart, stop, or warn (and apply it); auto (default) skips it where that costs no wait: on CPU ranks, and on GPU ranks whose optimizer takes a found_inf (fused Adam, AdamW, SGD); with another optimizer on a GPU it is applied and alerted a step late",
        },
    ),
    (
        ("--clip-grad",),
        {"type": _positive_float, "help": "enforce this global grad norm inside optimizer.step, also when the script does not clip"},
    ),
    (
        ("--bucket-view",),
        {
            "action": "store_true",
            "help": "build DDP with gradient_as_bucket_view=True where the script does not say: no copy of each gradient, and the grad norm taken a bucket at a time",
        },
    ),
    (
        ("--desync-every",),
        {"type": _non_negative_int, "help": f"steps between parameter checksums compared across ranks (default {DESYNC_EVERY}; 0: off)"},
    ),
    (("--on-desync",), {"choices": ON_DESYNC, "help": "ranks whose parameters differ: warn (default), restart or stop"}),
    (
        ("--hang-timeout",),
        {
            "type": _positive_float,
            "help": f"seconds without a step, every rank still, before the job counts as hung (default {HANG_TIMEOUT_S:g})",
        },
    ),
    (
        ("--on-hang",),
        {"choices": ON_HANG, "help": "a hang, once the stacks are collected: restart (default) restarts the group, stop stops the job"},
    ),
]


def option_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ddptop launch", add_help=False)
    for spellings, kwargs in OPTIONS:
        parser.add_argument(*spellings, dest=spellings[0][2:].replace("-", "_"), **kwargs)
    parser.set_defaults(**{f.name: f.default for f in dataclasses.fields(LaunchOptions)})
    return parser


_TAKES_VALUE = {spelling: kwargs.get("action") != "store_true" for spellings, kwargs in OPTIONS for spelling in spellings}


ENTRY_FLAGS = {"-m": "module", "--module": "module", "--no-python": "no_python", "--no_python": "no_python"}
"""torchrun's: the script is a module to run as `python -m` does, or a program to run without Python.
Before the script only: after it, `-m` is the script's own."""


@dataclass(frozen=True)
class LaunchOptions:
    """ddptop's own options of `ddptop launch`, typed and built once (then only replaced whole:
    SLURM's variables fill what the command line left unset, slurm.apply). Its defaults are the
    parser's: option_parser() takes them from here."""

    gpus: int | None = None
    nproc_per_node: int | None = None
    launch_style: StyleChoice = "auto"
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str | None = None
    rdzv_id: str | None = None
    aggregator: str | None = None
    join_timeout: float = 120.0
    listen: str | None = None
    token_file: Path | None = None
    prometheus: str | None = None
    max_restarts: int = 3
    restart_backoff: float = RESTART_BACKOFF_S
    crash_loop: int = CRASH_LOOP
    crash_loop_window: float = CRASH_LOOP_WINDOW_S
    no_progress: int = NO_PROGRESS
    no_template: bool = False
    headless: bool = False
    run_dir: Path | None = None
    summary_every: float = SUMMARY_EVERY_S
    on_nan: OnNan = "auto"
    clip_grad: float | None = None
    bucket_view: bool = False
    desync_every: int = DESYNC_EVERY
    on_desync: OnDesync = "warn"
    hang_timeout: float = HANG_TIMEOUT_S
    on_hang: OnHang = "restart"

    @classmethod
    def parse(cls, argv: list[str]) -> LaunchOptions:
        """The options from their command-line words; raise UsageError on bad input."""
        return cls(**vars(option_parser().parse_args(argv)))


@dataclass
class LaunchArgs:
    options: LaunchOptions
    script: Path
    script_args: list[str] = field(default_factory=list)
    module: bool = False
    no_python: bool = False
    notice: str | None = None
    """What of ddptop's options after the script went to the script, said once at launch."""

    @property
    def entry(self) -> str:
        """The script as the user named it: a path, `-m pkg.train`, or a program (its full path, when a file)."""
        if self.no_python and self.script.is_file():
            return str(self.script.absolute())
        return f"-m {self.script}" if self.module else str(self.script)


Declared = Callable[[str, bool], frozenset[str]]
"""The options a script declares, from its name (a path, or a module's name where the flag says)."""


def split(argv: list[str], declared: Declared = declared_by) -> LaunchArgs:
    """Split `ddptop launch` arguments; raise UsageError on bad input."""
    ours: list[str] = []
    entry: set[str] = set()
    script: str | None = None
    script_args: list[str] = []
    theirs: frozenset[str] = frozenset()
    took: list[str] = []
    left: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest = argv[i + 1 :]
            if script is None and rest:
                script, rest = rest[0], rest[1:]
            script_args.extend(rest)
            break
        name = arg.split("=", 1)[0]
        if script is None and arg in ENTRY_FLAGS:
            entry.add(ENTRY_FLAGS[arg])
        elif name in _TAKES_VALUE and script is not None and name in theirs:
            left.append(_said(argv, i))
            script_args.append(arg)
        elif name in _TAKES_VALUE:
            start = len(ours)
            ours.append(arg)
            if _TAKES_VALUE[name] and "=" not in arg:
                if i + 1 >= len(argv):
                    raise UsageError(f"option {name} needs a value")
                ours.append(argv[i + 1])
                i += 1
            if script is not None:
                took.append(" ".join(ours[start:]))
        elif script is None and arg.startswith("-"):
            raise UsageError(f"unknown option {name} (options for the script go after it, or after --)")
        elif script is None:
            script = arg
            theirs = declared(script, "module" in entry) if "no_python" not in entry else frozenset()
        else:
            script_args.append(arg)
        i += 1
    options = LaunchOptions.parse(ours)
    if script is None:
        raise UsageError("no training script given (ddptop launch train.py --gpus N, or -m pkg.train)")
    if options.gpus is not None and options.nproc_per_node is not None:
        raise UsageError("give --gpus or --nproc-per-node, not both")
    if entry == {"module", "no_python"}:
        raise UsageError("give -m or --no-python, not both")
    name = Path(script).name if "module" not in entry else script
    notice = _left_notice(name, left, took) if left else None
    return LaunchArgs(options, Path(script), script_args, module="module" in entry, no_python="no_python" in entry, notice=notice)


def _said(argv: list[str], i: int) -> str:
    """An option as the user wrote it, with its value when one follows: "--clip-grad 1.0"."""
    arg = argv[i]
    if "=" in arg or i + 1 >= len(argv) or argv[i + 1].startswith("-") or not _TAKES_VALUE[arg]:
        return arg
    return f"{arg} {argv[i + 1]}"


def _left_notice(script: str, left: list[str], took: list[str]) -> str:
    """ "--clip-grad 1.0 goes to train.py, which declares it; ddptop took --gpus 2 (ddptop's own go before the script)"."""
    which = "which declares it" if len(left) == 1 else "which declares them"
    text = f"{', '.join(left)} {'goes' if len(left) == 1 else 'go'} to {script}, {which}"
    if took:
        text += f"; ddptop took {', '.join(took)}"
    return text + f" (ddptop's own go before the script: ddptop launch {' '.join(left)} {script} ...)"
