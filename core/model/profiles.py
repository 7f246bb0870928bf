"""Profiler captures as the job model keeps them, and what a user reads of them.

`ddptop profile` and the dashboard's rank detail both fold the same
records (a `capture` from the supervisor, a `profile` from each rank; see
trainer/profiling.py) and say the same lines: each rank's step split into
phases with its top ops, and, where two or more ranks were captured in the
same steps, what differs: each rank against the median rank, phase by
phase and op by op, naming what is slower by more than WITHIN of the
median step ("rank 3: +41.2 ms in data wait, in
enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ +41.0 ms; the
rest within 5%").
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ddptop.core.wire import records

PHASES = (
    ("data", "data wait"),
    ("accumulation", "micro-batches before the synced one"),
    ("forward", "forward"),
    ("backward", "backward"),
    ("optimizer", "optimizer"),
    ("comm", "comm"),
)
"""A step's phases as a capture splits them, in the order a step runs (comm last: it is waiting).
Accumulation is there only where a step accumulated gradients over micro-batches (no_sync):
DDP times the synced micro-batch's forward and backward alone, the others are before it."""
WITHIN = 0.05
"""Differences smaller than this share of the median step are not named."""
FLOOR_MS = 0.1
"""Nor any under this."""
OPS_SHOWN = 5


@dataclass
class Capture:
    id: str
    state: str = "started"
    text: str = ""
    ranks: list[int] = field(default_factory=list)
    steps: int = 0
    results: dict[int, records.Profile] = field(default_factory=dict)
    """rank -> its profile record."""


def fold(captures: dict[str, Capture], record: records.Capture | records.Profile) -> Capture:
    """A capture or profile record into the captures by id; the capture it concerns."""
    capture = captures.get(record["id"])
    if capture is None:
        capture = captures[record["id"]] = Capture(record["id"])
    if record["type"] == "capture":
        capture.state, capture.text = record["state"], record["text"]
        capture.ranks = list(record.get("ranks") or capture.ranks)
        capture.steps = int(record.get("steps") or capture.steps)
    else:
        capture.results[record["rank"]] = record
    return capture


def rank_lines(profile: records.Profile) -> list[str]:
    """One rank's capture in a few lines: its steps and their phases, its top ops, its trace."""
    rank = profile["rank"]
    if "path" not in profile:
        return [f"rank {rank}: no capture: {profile.get('error', 'none made')}"]
    phases = profile.get("phases") or {}
    head = f"rank {rank}: {profile['steps']} steps from step {profile['first_step']}"
    if phases.get("step"):
        parts = [f"{label} {phases[key]:.1f}" for key, label in PHASES if key in phases]
        comm = phases.get("comm")
        if comm and phases.get("overlap") is not None:
            parts[-1] += f" ({phases['overlap']:.1f} beside the backward's compute)"
        head += f", {phases['step']:.1f} ms a step: " + ", ".join(parts) + " ms"
    else:
        head += " (no DDP timings: the phases are not known)"
    lines = [head]
    ops = profile.get("ops") or []
    by_cpu = sorted(ops, key=lambda op: -op[1])[:OPS_SHOWN]
    lines.append("  top self CPU: " + ", ".join(f"{name} {cpu:.2f} ms" for name, cpu, _, _ in by_cpu))
    by_cuda = [op for op in sorted(ops, key=lambda op: -op[2]) if op[2] > 0][:OPS_SHOWN]
    if by_cuda:
        lines.append("  top self CUDA: " + ", ".join(f"{name} {gpu:.2f} ms" for name, _, gpu, _ in by_cuda))
    if profile.get("error"):
        lines.append(f"  {profile['error']}")
    lines.append(f"  trace: {profile['path']}")
    return lines


def differences(results: dict[int, records.Profile]) -> dict[int, str]:
    """Each captured rank against the median rank, for two or more ranks with phases: what is
    slower (phases, then the ops behind it), or that it is within WITHIN of the median."""
    timed = _timed(results)
    if len(timed) < 2:
        return {}
    floor = max(FLOOR_MS, WITHIN * _median_step(timed))
    medians = {key: statistics.median(profile["phases"].get(key, 0.0) for profile in timed.values()) for key, _ in PHASES}
    op_times = {rank: {op[0]: op[1] + op[2] for op in profile.get("ops") or []} for rank, profile in timed.items()}
    names = {name for ops in op_times.values() for name in ops}
    op_medians = {name: statistics.median(ops.get(name, 0.0) for ops in op_times.values()) for name in names}
    said: dict[int, str] = {}
    for rank, profile in sorted(timed.items()):
        parts = [
            f"+{profile['phases'].get(key, 0.0) - medians[key]:.1f} ms in {label}"
            + (" (waiting for the other ranks)" if key == "comm" else "")
            for key, label in PHASES
            if profile["phases"].get(key, 0.0) - medians[key] > floor
        ]
        ops = op_times[rank]
        slower_ops = sorted(((ops[name] - op_medians[name], name) for name in ops if ops[name] - op_medians[name] > floor), reverse=True)[
            :OPS_SHOWN
        ]
        parts += [f"{name} +{diff:.1f} ms" for diff, name in slower_ops]
        said[rank] = f"rank {rank}: " + (
            "; ".join(parts) + f"; the rest within {WITHIN:.0%}" if parts else f"within {WITHIN:.0%} of the median rank"
        )
    return said


def summary_lines(capture: Capture) -> list[str]:
    """What a capture says, rank by rank, then what differs between them."""
    lines = [line for rank in sorted(capture.results) for line in rank_lines(capture.results[rank])]
    differ = differences(capture.results)
    if differ:
        lines.append(
            f"what differs from the median rank (more than {WITHIN:.0%} of its {_median_step(_timed(capture.results)):.1f} ms step):"
        )
        lines += [f"  {differ[rank]}" for rank in sorted(differ)]
    return lines


def _timed(results: dict[int, records.Profile]) -> dict[int, records.Profile]:
    """The ranks' profiles that have phases: those DDP timed."""
    return {rank: profile for rank, profile in results.items() if (profile.get("phases") or {}).get("step")}


def _median_step(timed: dict[int, records.Profile]) -> float:
    return float(statistics.median(profile["phases"]["step"] for profile in timed.values()))
