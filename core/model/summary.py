"""The job's totals in one line, for the headless summary."""

from __future__ import annotations

from typing import Any

from ddptop.core.format import count, duration, ms, nbytes


def line(totals: dict[str, Any], uptime_s: float) -> str:
    """One line a person can read in a log: progress, speed, comm, memory, alerts."""
    done = totals["steps_done"]
    progress = "-" if done is None else str(done)
    if done is not None and totals["total_steps"]:
        progress += f"/{totals['total_steps']}"
    share = totals["comm_share"]
    comm = f"comm {ms(totals['comm_ms'])} ms" + ("" if share is None else f" ({share:.0%})")
    if totals["gpu_mem"] is not None:
        memory = f"gpu mem {nbytes(totals['gpu_mem'])}"
    else:
        memory = f"rss {nbytes(totals['rss'])}"
    parts = [
        f"ddptop {duration(uptime_s)}",
        f"steps {progress}",
        f"ranks {totals['ranks_seen']}/{totals['world_size'] or '?'}",
        f"{count(totals['samples_per_s'])} samples/s",
        f"step {ms(totals['step_ms_p50'])}/{ms(totals['step_ms_p95'])} ms p50/p95",
        comm,
        memory,
        f"alerts {totals['alerts']}",
    ]
    parts += guard_parts(totals)
    if totals["restarts"]:
        parts.append(f"restarts {totals['restarts']}")
    if totals["checkpoint_step"] is not None:
        parts.append(f"ckpt {totals['checkpoint_step']}")
    if totals["dropped"]:
        parts.append(f"dropped {totals['dropped']}")
    return " | ".join(parts)


def guard_parts(totals: dict[str, Any]) -> list[str]:
    """What the in-rank guard did: clip rate, steps skipped for NaN/Inf or by the scaler."""
    parts = []
    if totals["clip_rate"] is not None:
        parts.append(f"clip {totals['clip_rate']:.0%}")
    if totals["nan_skips"]:
        parts.append(f"nan skips {totals['nan_skips']}")
    if totals["scaler_skips"]:
        parts.append(f"scaler skips {totals['scaler_skips']}")
    return parts
