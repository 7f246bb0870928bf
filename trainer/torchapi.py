"""The private parts of torch that ddptop uses, in one place, checked against the running torch.

torch has no public way to do a few things ddptop must: take a script's
comm hook behind its own (DDP keeps its hooks in `_comm_hooks` and checks
them with `_check_comm_hook`), read the scale a GradScaler multiplied the
loss by (`_scale`), and take a norm over many tensors in one kernel
(`_foreach_norm`, what clip_grad_norm_ itself calls). Every such name is
used through this module, and `missing()` says which of them the running
torch lacks: tests/test_torchapi.py runs it against the installed torch,
and CI runs the fast set on the oldest torch the package declares.

Imported only once the script has imported torch (hooks.py, guard.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

foreach_norm: Callable[..., Any] = torch._foreach_norm
foreach_mul_: Callable[..., Any] = torch._foreach_mul_


def comm_hooks(model: Any) -> list[Any]:
    """The comm hooks DDP keeps for a model: the script's, never ddptop's own default."""
    hooks: list[Any] = model._comm_hooks
    return hooks


def check_comm_hook(model: Any, hook: Any) -> None:
    """DDP's own checks of a hook's signature, as register_comm_hook runs them."""
    model._check_comm_hook(hook)


def name_comm_hook(model: Any, name: str) -> None:
    """What DDP's usage logger records as the model's comm hook."""
    logger = getattr(model, "logger", None)
    if logger is not None:
        logger._set_comm_hook_name(name)


def scaler_scale(scaler: Any) -> torch.Tensor | None:
    """The scale a GradScaler multiplies the loss by; None before its first scale() or when disabled."""
    scale: torch.Tensor | None = getattr(scaler, "_scale", None)
    return scale


def flight_recorder_dump() -> Callable[..., bytes] | None:
    """torch's flight-recorder dump (renamed in 2.8), None where this torch has none."""
    c10d = getattr(torch._C, "_distributed_c10d", None)
    dump: Callable[..., bytes] | None = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    return dump


def missing() -> list[str]:
    """The private names above that the running torch lacks (a GradScaler's and a DDP model's
    instance attributes are looked for on fresh instances)."""
    absent = [name for name in ("_foreach_norm", "_foreach_mul_") if not hasattr(torch, name)]
    absent += [
        f"DistributedDataParallel.{n}"
        for n in ("_check_comm_hook", "_register_builtin_comm_hook")
        if not hasattr(DistributedDataParallel, n)
    ]
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_class is None:
        absent.append("torch.amp.GradScaler")
    elif not hasattr(scaler_class("cpu"), "_scale"):
        absent.append("GradScaler._scale")
    return absent
