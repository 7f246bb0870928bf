"""What a model's forward inputs say of its batch: the samples in it, and its tokens.

A step's samples are the leading dimension of the first tensor its model's
training forward is given, and its tokens the elements of that forward's
token ids; hooks.py reads them at DDP's forward, sharded_forward.py at the
outermost FSDP2-sharded module's. monitor.step(samples=, tokens=) wins.

Imported only once the script has imported torch (hooks.py).
"""

from __future__ import annotations

from typing import Any

import torch

TOKEN_DTYPES = frozenset(
    getattr(torch, name) for name in ("uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64") if hasattr(torch, name)
)
"""Integer dtypes, the ones token ids come in (not floats, complex numbers or bools)."""


def tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Elements of the forward's token ids: its `input_ids`, else its first positional
    tensor, when that is 2-D and of integers (images and 1-D labels are not tokens)."""
    ids = kwargs.get("input_ids") if kwargs else None
    if ids is None:
        ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if not isinstance(ids, torch.Tensor) or ids.dtype not in TOKEN_DTYPES or ids.dim() != 2:
        return None
    return ids.numel()


def size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Leading dimension of the first tensor in the forward's inputs."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            candidates = value
        elif isinstance(value, dict):
            candidates = list(value.values())
        else:
            candidates = (value,)
        for item in candidates:
            shape = getattr(item, "shape", None)
            if shape is not None and len(shape) > 0:
                return int(shape[0])
    return None
