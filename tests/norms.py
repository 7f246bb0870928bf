"""The reference a test checks the guard's norms against: each tensor normed alone, then the
norm of those norms, as torch.nn.utils.get_total_norm takes it (which came in torch 2.6); and
the buffers the guard found to norm an optimizer's gradients by."""

from __future__ import annotations

from typing import Any

import torch


def total_norm(tensors: list[torch.Tensor]) -> float:
    """The global L2 norm of tensors, one by one, read."""
    return torch.linalg.vector_norm(torch.stack([t.norm() for t in tensors])).item()


def flat_of(probe: Any, optimizer: torch.optim.Optimizer) -> Any:
    """The flat buffers (guard.Flat, or None) the guard norms optimizer's gradients by, as
    found for the count of gradients it holds now (Probe.gradients)."""
    count = sum(p.grad is not None for group in optimizer.param_groups for p in group["params"])
    return probe.gradients[id(optimizer), count].flat
