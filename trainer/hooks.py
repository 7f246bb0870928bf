"""Where a rank is measured: the torch hooks that feed the step tracker.

Installed once, right after the script imports torch (see runtime.py), and
only through torch's public extension points, so the script runs unchanged:

- DistributedDataParallel.__init__ is wrapped to add a forward pre-hook
  (step start, samples) and a forward hook (phase) to each DDP model;
- at a model's first forward, if the script registered no comm hook of its
  own, a timed all-reduce with the semantics of DDP's default is registered;
  a comm hook the script registers itself is wrapped with the same timing;
- the global optimizer step pre/post hooks mark the step boundary and
  measure the grad norm before the optimizer sees the gradients, within a
  budget of the step time (budget.py): every step on any job whose steps
  are long against one pass over the gradients, sampled on tiny ones.

This module imports torch at the top: runtime.py imports it only from the
callback that runs once the script's own `import torch` has finished.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddptop.trainer import late
from ddptop.trainer.budget import Budget
from ddptop.trainer.commtimer import CommTimer
from ddptop.trainer.steps import StepTracker


def install(tracker: StepTracker) -> None:
    timer = CommTimer()
    budget = Budget()
    _wrap_ddp(tracker, timer)
    register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: _optimizer_begin(tracker, budget, optimizer))
    register_optimizer_step_post_hook(
        lambda optimizer, args, kwargs: _optimizer_end(tracker, timer)
    )


_original_register = DistributedDataParallel.register_comm_hook


def _wrap_ddp(tracker: StepTracker, timer: CommTimer) -> None:
    original_init = DistributedDataParallel.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.register_forward_pre_hook(_forward_pre_hook(tracker, timer), with_kwargs=True)
        self.register_forward_hook(lambda module, args, output: tracker.forward_end())

    @functools.wraps(_original_register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        _original_register(self, state, _timed(hook, tracker, timer))

    DistributedDataParallel.__init__ = __init__
    DistributedDataParallel.register_comm_hook = register_comm_hook


def _forward_pre_hook(tracker: StepTracker, timer: CommTimer) -> Any:
    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        if not getattr(module, "_ddptop_comm_hooked", False):
            module._ddptop_comm_hooked = True
            _ensure_comm_hook(module, tracker, timer)
        if module.training and torch.is_grad_enabled():
            tracker.forward_begin(_batch_size(args, kwargs))

    return hook


def _ensure_comm_hook(model: Any, tracker: StepTracker, timer: CommTimer) -> None:
    """Register a timed default all-reduce unless the script has a hook of its own."""
    if model._comm_hooks:
        return
    try:
        _original_register(model, model.process_group, _timed(_allreduce_mean, tracker, timer))
    except (RuntimeError, ValueError):
        # A built-in C++ hook is already registered: leave it, untimed.
        return


def _allreduce_mean(process_group, bucket):  # type: ignore[no-untyped-def]
    """DDP's default arithmetic (divide, then sum), as torch's allreduce_hook does it.

    It returns c10d's future as is (its value is a one-tensor list) and leaves
    the unwrapping to _timed's callback, so each bucket costs one callback.
    """
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer().div_(group.size())
    return dist.all_reduce(buffer, group=group, async_op=True).get_future()


def _timed(hook: Any, tracker: StepTracker, timer: CommTimer) -> Any:
    """A comm hook that times the hook it wraps.

    DDP inspects a hook's signature: the parameter must be named `bucket`,
    and any annotation must be the real GradBucket class, so the wrapper
    carries none (this module's postponed annotations would be strings).
    """

    def timed_hook(state, bucket):  # type: ignore[no-untyped-def]
        tracker.comm_begin()
        span = timer.begin(bucket.buffer())

        def done(fut):  # type: ignore[no-untyped-def]
            timer.end(span)
            value = fut.value()
            return value[0] if isinstance(value, list) else value

        return hook(state, bucket).then(done)

    timed_hook.__name__ = getattr(hook, "__name__", "comm_hook")
    timed_hook.__qualname__ = getattr(hook, "__qualname__", timed_hook.__name__)
    return timed_hook


def _optimizer_begin(tracker: StepTracker, budget: Budget, optimizer: Any) -> None:
    if not budget.due(tracker.last_step_s):
        tracker.optimizer_begin({})
        return
    start = time.perf_counter()
    norm = _grad_norm(optimizer)
    budget.spent(time.perf_counter() - start)
    tracker.optimizer_begin({"grad_norm": norm})


def _optimizer_end(tracker: StepTracker, timer: CommTimer) -> None:
    values: dict[str, Any] = _memory()
    comm = timer.take()
    if comm is not None:
        values["comm_ms"], values["comm_bytes"] = comm
    tracker.optimizer_end(values)


def _grad_norm(optimizer: Any) -> Any:
    """The global L2 norm of the gradients the optimizer is about to apply."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads)
    if not norms[0].is_cuda:
        # A few host reads beat stacking and a second kernel for CPU tensors.
        return math.sqrt(math.fsum(float(n) ** 2 for n in norms))
    if any(n.device != norms[0].device for n in norms):
        norms = [n.to(norms[0].device) for n in norms]
    return late.scalar(torch.linalg.vector_norm(torch.stack(norms)))


def _memory() -> dict[str, int]:
    """CUDA caching-allocator figures; these are host-side counters, no sync."""
    if not torch.cuda.is_initialized():
        return {}
    return {
        "mem_alloc": torch.cuda.memory_allocated(),
        "mem_reserved": torch.cuda.memory_reserved(),
        "mem_peak": torch.cuda.max_memory_allocated(),
    }


def _batch_size(args: tuple, kwargs: dict) -> int | None:
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
