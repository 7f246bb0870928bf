"""FSDP1 (FullyShardedDataParallel): a model sharded over ranks by a wrapper in every unit.

ddptop is for DDP, but a script that shards its model with FSDP1, as many
still do (Accelerate's and Lightning's FSDP among them), must be shown
nothing wrong. Its parameters are flat shards (FlatParameter), or, with
use_orig_params, views of them: plain tensors, each rank's a different part.
So, wrapped once torch.distributed.fsdp is imported, never importing it:

- FullyShardedDataParallel.__init__: each instance is watched for the
  forward that begins the steps (sharded_forward.Outermost: the root's);
  the parameters of one that shards (every strategy but NO_SHARD, which
  all-reduces and keeps them whole as DDP does) are recorded in
  Probe.fsdp1 with their outermost instance, the root whose own
  clip_grad_norm_ measures them. The guard then checks such a step on its
  own shards and never skips it, as FSDP2's (guard.sharded_norms), and the
  checksum leaves them out (ranks' shards differ by design);
- FullyShardedDataParallel.clip_grad_norm_: the global norm it returns is
  the step's grad norm, as torch.nn.utils.clip_grad_norm_'s is (hooks.py).
"""

from __future__ import annotations

import functools
import math
import sys
import weakref
from typing import Any

import torch

from ddptop.trainer import importwatch, patches
from ddptop.trainer.probe import Probe
from ddptop.trainer.sharded_forward import Outermost, group_size

FSDP1_MODULE = "torch.distributed.fsdp"


def install(probe: Probe, outermost: Outermost) -> None:
    importwatch.after_import(FSDP1_MODULE, functools.partial(_wrap, probe, outermost))


def _wrap(probe: Probe, outermost: Outermost) -> None:
    fsdp1 = getattr(sys.modules[FSDP1_MODULE], "FullyShardedDataParallel", None)
    if fsdp1 is None:
        return
    original_init, original_clip = fsdp1.__init__, fsdp1.clip_grad_norm_

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        outermost.watch(self)
        if getattr(getattr(self, "sharding_strategy", None), "name", "NO_SHARD") == "NO_SHARD":
            return
        probe.world = max(probe.world, group_size())
        # Nested units are built inside their parent's __init__: the parent, built last, is each
        # parameter's outermost instance.
        live = {key: entry for key, entry in probe.fsdp1.items() if entry[0]() is not None}
        root = weakref.ref(self)
        live.update((id(param), (weakref.ref(param), root)) for param in self.parameters())
        probe.fsdp1 = live

    @functools.wraps(original_clip)
    def clip_grad_norm_(self: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        clips = probe.clip.clips  # a root whose units all keep parameters whole calls torch's, which counts itself
        norm = original_clip(self, max_norm, *args, **kwargs)
        probe.clip.clipped, probe.clip.clips = list(self.parameters()), clips + 1
        probe.clip.script_norm = (norm, probe.scaler.scale is not None and not probe.scaler.unscaled) if probe.clip.clips == 1 else None
        return norm

    def global_norm(root: Any) -> torch.Tensor:
        """The global norm of the gradients a root holds over its ranks, by its own clip_grad_norm_
        (the all-reduce --clip-grad asks for); a clip at infinity scales each of them by 1."""
        return original_clip(root, math.inf)

    probe.fsdp1_norm = global_norm
    patches.replace(fsdp1, "__init__", __init__)
    patches.replace(fsdp1, "clip_grad_norm_", clip_grad_norm_)
