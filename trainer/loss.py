"""A step's loss, in one place: what counts as one, and how a step's losses become its figure.

A loss is what the script called backward() on (hooks._wrap_backward hands each
one to the step tracker: the usual one scalar loss with no scaler goes straight
onto `tracker.losses`, any other through hand_over), or what monitor.step(loss=)
said (steps.StepTracker.explicit, which wins). The optimizer step packs the
step's losses with the guard's pack (optimizer_step: one copy to the host,
each marked if a GradScaler scaled it: `scaled_marks`) and `packed` turns them
into the step's figure once the pack is read; a step the guard never packed
reads its own (`unpacked`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddptop.trainer import late

if TYPE_CHECKING:
    import torch

    from ddptop.trainer.probe import Probe


def hand_over(probe: Probe, tensor: torch.Tensor) -> None:
    """One loss to the step, as a 0-d tensor, marked if a GradScaler scaled it."""
    tracker = probe.tracker
    known = probe.scaler.scaled.get(id(tensor)) if probe.scaler.scaled else None
    if known is not None and known[0]() is tensor:
        probe.scaler.scaled_at.append(len(tracker.losses))
        tracker.loss_ids.append(known[1])
    else:
        tracker.loss_ids.append(id(tensor))
    tracker.losses.append(tensor.reshape(()) if tensor.dim() else tensor)


def scaled_marks(probe: Probe, count: int) -> tuple[bool, ...]:
    """Which of the step's count losses a GradScaler scaled, taken off the probe for the next
    step: the pack carries the scale to divide those by."""
    marks = tuple(i in probe.scaler.scaled_at for i in range(count))
    probe.scaler.scaled_at = []
    return marks


def packed(values: list[float], scaled: tuple[bool, ...], scale: float, divisor: int) -> float:
    """The step's loss from the pack read on the host: each loss a GradScaler scaled unscaled,
    summed, and divided where a pipeline schedule summed its micro-batches' (pipelining.py)."""
    loss = 0.0
    for value, was_scaled in zip(values, scaled):
        loss += value / scale if was_scaled else value
    return loss / divisor


def unpacked(values: list[Any]) -> Any:
    """A closed step's backward() values that no guard packed (a backward after the guard had
    taken the step's; a step a GradScaler skipped packs its own, optimizer_step.losses_only):
    on a GPU, summed on the device and on their way to the host, a Late; on the CPU their sum,
    read now (None when none was a loss).

    A CPU step's losses are read on the training thread, not held for the sender's: tensors
    held for another thread and freed there leave the training thread's next steps slower
    (their graphs, and memory its allocator gets back on another thread). A loss a GradScaler
    scaled goes as it is: without an optimizer step there is no scale to undo."""
    if not getattr(values[0], "is_cuda", False):
        return _read_sum(values)
    total: Any = None
    for value in values:
        if is_loss(value):
            value = value.detach().float().reshape(()) if hasattr(value, "detach") else value
            total = value if total is None else total + value
    return None if total is None else late.scalar(total) if getattr(total, "is_cuda", False) else float(total)


def _read_sum(values: list[Any]) -> float | None:
    """The sum of a CPU step's backward() values, read; None when none was a loss."""
    read = [float(value.item()) if hasattr(value, "item") else float(value) for value in values if is_loss(value)]
    return sum(read) if read else None


def is_loss(value: Any) -> bool:
    """Whether a backward() value can be a loss: a number, or a one-element real floating-point
    tensor (a non-scalar called with a gradient, an integer or complex one are not)."""
    if not hasattr(value, "numel"):
        return True
    return bool(value.numel() == 1 and value.is_floating_point())
