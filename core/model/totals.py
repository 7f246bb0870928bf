"""The job's figures at one moment: what the header, the summary line and
the per-second summary record show.

The job-wide counts are fields; the job figure of every metric in the
table (metrics.py) is in `metrics`, read with `of(metric)`, so a new metric
needs no new field here or in the summary record's schema.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import cast

from ddptop.core.model.metrics import Metric
from ddptop.core.wire import records


@dataclass(frozen=True)
class JobTotals:
    ranks_seen: int = 0
    world_size: int = 0
    steps_done: int | None = None
    """Steps every rank has finished: the slowest rank's count."""
    total_steps: int | None = None
    dropped: int = 0
    alerts: int = 0
    nan_skips: int = 0
    scaler_skips: int = 0
    clip_rate: float | None = None
    restarts: int = 0
    checkpoint_step: int | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)

    def of(self, metric: Metric) -> float | None:
        return self.metrics.get(metric.key)

    def record(self, wall: float) -> records.Summary:
        """The per-second summary record that dashboards plot."""
        return cast(records.Summary, {"type": "summary", "wall": wall, **asdict(self)})
