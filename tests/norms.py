"""The reference a test checks the guard's norms against: each tensor normed alone, then the
norm of those norms, as torch.nn.utils.get_total_norm takes it (which came in torch 2.6)."""

from __future__ import annotations

import torch


def total_norm(tensors: list[torch.Tensor]) -> float:
    """The global L2 norm of tensors, one by one, read."""
    return torch.linalg.vector_norm(torch.stack([t.norm() for t in tensors])).item()
