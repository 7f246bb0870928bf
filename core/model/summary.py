"""The job's totals in one line, for the headless summary and the logs.

Progress and ranks first, then one part per summary template of the metric
table (a metric not measured in this job, such as GPU memory on CPU ranks,
is left out), then alerts and what the in-rank guard did.
"""

from __future__ import annotations

from ddptop.core.format import duration
from ddptop.core.model.metrics import grouped
from ddptop.core.model.totals import JobTotals


def line(totals: JobTotals, uptime_s: float) -> str:
    """One line a person can read in a log: progress, speed, comm, memory, alerts."""
    done = totals.steps_done
    progress = "-" if done is None else str(done)
    if done is not None and totals.total_steps:
        progress += f"/{totals.total_steps}"
    parts = [f"ddptop {duration(uptime_s)}", f"steps {progress}", f"ranks {totals.ranks_seen}/{totals.world_size or '?'}"]
    for template, metrics in grouped(lambda metric: metric.summary):
        values = [totals.of(metric) for metric in metrics]
        if any(value is not None for value in values):
            parts.append(template.format(*(metric.text(value) for metric, value in zip(metrics, values))))
    parts.append(f"alerts {totals.alerts}")
    parts += guard_parts(totals)
    if totals.restarts:
        parts.append(f"restarts {totals.restarts}")
    if totals.checkpoint_step is not None:
        parts.append(f"ckpt {totals.checkpoint_step}")
    if totals.dropped:
        parts.append(f"dropped {totals.dropped}")
    return " | ".join(parts)


def guard_parts(totals: JobTotals) -> list[str]:
    """What the in-rank guard did: clip rate, steps skipped for NaN/Inf or by the scaler."""
    parts = []
    if totals.clip_rate is not None:
        parts.append(f"clip {totals.clip_rate:.0%}")
    if totals.nan_skips:
        parts.append(f"nan skips {totals.nan_skips}")
    if totals.scaler_skips:
        parts.append(f"scaler skips {totals.scaler_skips}")
    return parts
