"""Where a step of a model FSDP2 shards begins: the forward of its outermost sharded module.

A DDP job's steps begin at DDP's forward (hooks.py), which also gives their
samples and tokens. A model sharded with FSDP2's fully_shard has no such
wrapper: FSDP runs hooks of its own on each sharded module. So fully_shard
is wrapped, and each module it shards gets a forward pre-hook that fires
once. The first to fire, at the model's first forward, is the outermost
sharded module's: the root, or the first layer of a model whose root was
left plain. The others are removed, and that module keeps a pre-hook that
begins (or adds to) a step with its batch, as DDP's forward does: one
Python call a forward, however many modules are sharded.

Imported only once the script has imported torch (hooks.py); fully_shard is
wrapped once its module is imported (torch.distributed.fsdp, or
torch.distributed._composable.fsdp before torch 2.6), never importing it.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch

from ddptop.trainer import batch, importwatch, patches
from ddptop.trainer.probe import Probe

FULLY_SHARD_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


def install(probe: Probe) -> None:
    for name in FULLY_SHARD_MODULES:
        importwatch.after_import(name, functools.partial(_wrap_fully_shard, probe, name))


def _wrap_fully_shard(probe: Probe, name: str) -> None:
    owner = sys.modules[name]
    original = getattr(owner, "fully_shard", None)
    if original is None:
        return
    tracker = probe.tracker
    waiting: list[Any] = []
    """The once-only pre-hooks of the modules sharded so far, until the first forward."""

    @functools.wraps(original)
    def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
        sharded = original(module, *args, **kwargs)
        for each in module if isinstance(module, (list, tuple)) else (module,):
            waiting.append(each.register_forward_pre_hook(first, with_kwargs=True))
        return sharded

    def first(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for handle in waiting:
            handle.remove()
        waiting.clear()
        module.register_forward_pre_hook(begin, with_kwargs=True)
        begin(module, args, kwargs)

    def begin(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Every forward counts; a training one begins (or adds to) a step, as DDP's forward does (hooks.py)."""
        tracker.forwards += 1
        if module.training and torch.is_grad_enabled():
            tracker.forward_begin(batch.size(args, kwargs), batch.tokens(args, kwargs), id(module))

    patches.replace(owner, "fully_shard", fully_shard)
