"""The explicit API a training script may use; optional, and free without ddptop.

    from ddptop.trainer import monitor
    monitor.configure(total_steps=1000)      # lets the dashboard show an ETA
    monitor.step(loss=loss, samples=len(batch), tokens=n_tokens)

Everything else is measured without the script's help. When the script does
not run under `ddptop launch`, nothing is bound here and every call returns
at once. Passing a CUDA tensor as the loss is fine: it is read a step late,
never synchronised.

Checkpoints (checkpoint.py) are the exception: they are the script's own
data, so `checkpoint` and `resume` work with or without ddptop:

    resumed = monitor.resume(model, optimizer, scheduler, directory="ckpt")
    start = 0 if resumed is None else resumed.step + 1
    ...
    monitor.checkpoint(model, optimizer, scheduler, step=step, directory="ckpt",
                       data={"epoch": epoch, "offset": offset})
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddptop.core import launch_env
from ddptop.trainer.steps import StepTracker

if TYPE_CHECKING:
    from ddptop.trainer.checkpoint import Resumed

_tracker: StepTracker | None = None


def bind(tracker: StepTracker | None) -> None:
    """Connect the API to this rank's tracker (done by the bootstrap); None disconnects it."""
    global _tracker
    _tracker = tracker


def enabled() -> bool:
    """Whether this process reports to a ddptop supervisor."""
    return _tracker is not None


def attempt() -> int:
    """Which attempt of the job this rank runs in, 0 first, the same on every node.

    Without ddptop it is torchrun's own restart count (0 outside torchrun).
    """
    return int(os.environ.get(launch_env.ATTEMPT, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


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


def checkpoint(
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    *,
    step: int,
    directory: str | os.PathLike[str],
    data: dict[str, Any] | None = None,
    keep: int = 3,
) -> Path | None:
    """Save the state after `step` atomically from rank 0, keeping the newest `keep`.

    Every rank must call it at the same step (their RNG states are gathered
    to rank 0); `data` is the data position, the same on every rank (e.g.
    the sampler's epoch and the offset within it). Returns the file on rank
    0, None on the others. Raises CheckpointError when it cannot write.
    """
    from ddptop.trainer import checkpoint as ckpt

    started = time.perf_counter()
    path = ckpt.save(Path(directory), step, model, optimizer, scheduler, data, keep)
    if path is not None and _tracker is not None:
        _tracker.event(
            {
                "type": "checkpoint",
                "rank": _tracker.rank,
                "wall": time.time(),
                "step": int(step),
                "path": str(path),
                "bytes": path.stat().st_size,
                "write_ms": (time.perf_counter() - started) * 1e3,
            }
        )
    return path


def resume(model: Any, optimizer: Any = None, scheduler: Any = None, *, directory: str | os.PathLike[str]) -> Resumed | None:
    """Load the newest intact checkpoint into these objects; None when there is none yet.

    Call it on every rank after building the model, optimizer and scheduler
    and before the first step; go on from `resumed.step + 1` at
    `resumed.data`. A damaged newest file is passed over for the previous
    one, and said so. Raises CheckpointError for a directory that is not
    writable or a checkpoint that does not fit the model.
    """
    from ddptop.trainer import checkpoint as ckpt

    resumed = ckpt.restore(Path(directory), model, optimizer, scheduler)
    if resumed is None:
        return None
    rank = _tracker.rank if _tracker is not None else int(os.environ.get("RANK", "0"))
    if resumed.damaged and rank == 0:
        print(
            f"ddptop: damaged checkpoint(s) {', '.join(resumed.damaged)} passed over; resuming from {resumed.path.name}",
            file=sys.stderr,
            flush=True,
        )
    if _tracker is not None:
        _tracker.resumed_at(resumed.step + 1)
        _tracker.event(
            {
                "type": "resume",
                "rank": rank,
                "wall": time.time(),
                "step": resumed.step,
                "path": str(resumed.path),
                "damaged": resumed.damaged,
            }
        )
    return resumed
