"""The explicit API a training script may use; optional, and free without ddptop.

    from ddptop.trainer import monitor
    monitor.configure(total_steps=1000)      # lets the dashboard show an ETA
    monitor.step(loss=loss, samples=len(batch), tokens=n_tokens)

Everything else is measured without the script's help. When the script does
not run under `ddptop launch`, nothing is bound here and every call returns
at once. Passing a CUDA tensor as the loss is fine: it is read a step late,
never synchronised.
"""

from __future__ import annotations

from typing import Any

from ddptop.trainer.steps import StepTracker

_tracker: StepTracker | None = None


def bind(tracker: StepTracker) -> None:
    """Connect the API to this rank's tracker (done by the bootstrap)."""
    global _tracker
    _tracker = tracker


def enabled() -> bool:
    """Whether this process reports to a ddptop supervisor."""
    return _tracker is not None


def configure(total_steps: int | None = None) -> None:
    """Tell ddptop facts about the run it cannot see, such as its length."""
    if _tracker is not None and total_steps is not None:
        _tracker.total_steps = int(total_steps)


def step(loss: Any = None, samples: int | None = None, tokens: int | None = None) -> None:
    """Report the step's loss and exact sample/token counts.

    Call it once per optimizer step, before or after optimizer.step(); the
    values join the record of that step.
    """
    if _tracker is not None:
        _tracker.explicit(loss, None if samples is None else int(samples), None if tokens is None else int(tokens))
