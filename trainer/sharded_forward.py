"""Where a step of a model FSDP shards begins: the forward of its outermost sharded module.

A DDP job's steps begin at DDP's forward (hooks.py), which also gives their
samples and tokens. A model sharded with FSDP2's fully_shard has no such
wrapper: FSDP runs hooks of its own on each sharded module. FSDP1's
FullyShardedDataParallel is a wrapper, but one nested in every unit it
shards (fsdp1.py). So each module FSDP shards gets a forward pre-hook that
fires once (Outermost.watch). The first to fire, at the model's first
forward, is the outermost sharded module's: the root, or the first layer of
a model whose root was left plain. The others are removed, and that module
keeps a pre-hook that begins (or adds to) a step with its batch, as DDP's
forward does: one Python call a forward, however many modules are sharded.
A module parallelize_module splits is watched the same way, so a model that
tensor parallelism alone splits has its steps begin too; where its mesh is the
whole job, every rank is given the same batch (Probe.batch_shared_by).

Imported only once the script has imported torch (hooks.py); fully_shard is
wrapped once its module is imported (torch.distributed.fsdp, or
torch.distributed._composable.fsdp before torch 2.6), and parallelize_module once
torch.distributed.tensor.parallel is, never importing them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

from ddptop.trainer import batch, importwatch, patches
from ddptop.trainer.probe import Probe

FULLY_SHARD_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")
TENSOR_PARALLEL_MODULE = "torch.distributed.tensor.parallel"


class Outermost:
    """The once-only forward pre-hooks of the modules sharded so far, until the first forward
    picks the outermost of them to begin the steps."""

    def __init__(self, probe: Probe) -> None:
        self._probe = probe
        self._tracker = probe.tracker
        self._waiting: list[Any] = []
        self._watched: set[int] = set()
        """The ids of the modules waiting: one that both parallelize_module and fully_shard
        took is watched once."""

    def watch(self, module: Any) -> None:
        """module is sharded: its forward may be the one that begins the steps."""
        if id(module) in self._watched:
            return
        self._watched.add(id(module))
        self._waiting.append(module.register_forward_pre_hook(self._first, with_kwargs=True))

    def _first(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for handle in self._waiting:
            handle.remove()
        self._waiting.clear()
        self._watched.clear()
        module.register_forward_pre_hook(self._begin, with_kwargs=True)
        self._begin(module, args, kwargs)

    def _begin(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Every forward counts; a training one begins (or adds to) a step, as DDP's forward does
        (hooks.py). A pipeline stage's run to learn its shapes is none (pipelining.py)."""
        if self._probe.pipeline.inferring_shapes:
            return
        tracker = self._tracker
        tracker.forwards += 1
        if module.training and torch.is_grad_enabled():
            # model(x), the usual forward, read with no call (as DDP's forward reads it, hooks.py)
            if args and not kwargs and isinstance(first := args[0], torch.Tensor) and (shape := first.shape):
                tokens = shape[0] * shape[1] if len(shape) == 2 and first.dtype in batch.TOKEN_DTYPES else None
                tracker.forward_begin(shape[0], tokens, id(module))
            else:
                tracker.forward_begin(batch.size(args, kwargs), batch.tokens(args, kwargs), id(module))


def install(probe: Probe, outermost: Outermost) -> None:
    for name in FULLY_SHARD_MODULES:
        importwatch.after_import(name, functools.partial(_after, name, "fully_shard", functools.partial(_sharded, probe, outermost)))
    parallelized = functools.partial(_parallelized, probe, outermost)
    importwatch.after_import(TENSOR_PARALLEL_MODULE, functools.partial(_after, TENSOR_PARALLEL_MODULE, "parallelize_module", parallelized))


def _after(owner_name: str, name: str, then: Callable[[Any, tuple[Any, ...], dict[str, Any]], None]) -> None:
    """owner's function name (fully_shard, parallelize_module: each takes the module first)
    wrapped so that then(module, args, kwargs) follows each call of it; nothing where this torch
    lacks it."""
    owner = sys.modules[owner_name]
    original = getattr(owner, name, None)
    if original is None:
        return

    @functools.wraps(original)
    def wrapped(module: Any, *args: Any, **kwargs: Any) -> Any:
        done = original(module, *args, **kwargs)
        then(module, args, kwargs)
        return done

    patches.replace(owner, name, wrapped)


def _sharded(probe: Probe, outermost: Outermost, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """fully_shard took module (or a list of them)."""
    probe.world = max(probe.world, group_size())
    mesh = kwargs.get("mesh")  # keyword-only: FSDP over part of the job, tensor parallelism over the rest
    if mesh is not None and mesh.size() < group_size():
        probe.data_parallel_over(int(rank) for rank in mesh.mesh.flatten().tolist())
    probe.ignore(kwargs.get("ignored_params") or ())
    for each in module if isinstance(module, (list, tuple)) else (module,):
        outermost.watch(each)


def _parallelized(probe: Probe, outermost: Outermost, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """parallelize_module split module. A model that tensor parallelism alone splits (no
    fully_shard or DDP beside it) begins its steps at the forward of its outermost module
    parallelize_module took, as FSDP's does; one that FSDP shards too begins at the outermost of
    either."""
    mesh = kwargs.get("device_mesh", args[0] if args else None)
    if mesh is not None and mesh.size() == group_size() > 1:  # over the whole job: one batch for every rank
        probe.batch_shared_by(mesh.size())
    outermost.watch(module)


def group_size() -> int:
    """The job's world size, which a sharded model's ranks share: at 1, a non-finite gradient is
    this rank's own (guard.Layout.solo), as at a DDP model's group of one."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
