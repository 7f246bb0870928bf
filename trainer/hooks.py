"""Where a rank is measured: the torch hooks that feed the step tracker.

Installed once, right after the script imports torch (see runtime.py), and
only through torch's public extension points, so the script runs unchanged:

- DistributedDataParallel.__init__ is wrapped to add a forward pre-hook
  (step start, samples) and a forward hook (phase) to each DDP model;
- at a model's first forward, if the script registered no comm hook of its
  own, DDP's default all-reduce is registered through a timing wrapper; a
  comm hook the script registers itself is wrapped the same way;
- the global optimizer step pre/post hooks mark the step boundary and
  measure the grad norm before the optimizer sees the gradients.

This module imports torch at the top: runtime.py imports it only from the
callback that runs once the script's own `import torch` has finished.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddptop.trainer import late
from ddptop.trainer.commtimer import CommTimer
from ddptop.trainer.steps import StepTracker


def install(tracker: StepTracker) -> None:
    timer = CommTimer()
    _wrap_ddp(DistributedDataParallel, tracker, timer)
    register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: _optimizer_begin(tracker, optimizer))
    register_optimizer_step_post_hook(
        lambda optimizer, args, kwargs: _optimizer_end(tracker, timer, optimizer)
    )


def _wrap_ddp(ddp_class: Any, tracker: StepTracker, timer: CommTimer) -> None:
    original_init = ddp_class.__init__
    original_register = ddp_class.register_comm_hook

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.register_forward_pre_hook(_forward_pre_hook(tracker), with_kwargs=True)
        self.register_forward_hook(lambda module, args, output: tracker.forward_end())

    @functools.wraps(original_register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        original_register(self, state, _timed(hook, tracker, timer))

    ddp_class.__init__ = __init__
    ddp_class.register_comm_hook = register_comm_hook


def _forward_pre_hook(tracker: StepTracker) -> Any:
    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        if not getattr(module, "_ddptop_comm_hooked", False):
            module._ddptop_comm_hooked = True
            _ensure_comm_hook(module)
        if module.training and torch.is_grad_enabled():
            tracker.forward_begin(_batch_size(args, kwargs))

    return hook


def _ensure_comm_hook(model: Any) -> None:
    """Register DDP's own default all-reduce, timed, unless the script has a hook."""
    if model._comm_hooks:
        return
    try:
        model.register_comm_hook(model.process_group, allreduce_hook)
    except (RuntimeError, ValueError):
        # A built-in C++ hook is already registered: leave it, untimed.
        return


def _timed(hook: Any, tracker: StepTracker, timer: CommTimer) -> Any:
    """A comm hook that times the hook it wraps.

    DDP inspects a hook's signature: the parameter must be named `bucket`,
    and any annotation must be the real GradBucket class, so the wrapper
    carries none (this module's postponed annotations would be strings).
    """

    def timed_hook(state, bucket):  # type: ignore[no-untyped-def]
        tracker.comm_begin()
        span = timer.begin(bucket.buffer())

        def done(fut: Any) -> Any:
            timer.end(span)
            return fut.value()

        return hook(state, bucket).then(done)

    timed_hook.__name__ = getattr(hook, "__name__", "comm_hook")
    timed_hook.__qualname__ = getattr(hook, "__qualname__", timed_hook.__name__)
    return timed_hook


def _optimizer_begin(tracker: StepTracker, optimizer: Any) -> None:
    tracker.optimizer_begin({"grad_norm": _grad_norm(optimizer)})


def _optimizer_end(tracker: StepTracker, timer: CommTimer, optimizer: Any) -> None:
    values: dict[str, Any] = {}
    spans = timer.take()
    if spans is not None:
        values["comm_ms"] = spans
        values["comm_bytes"] = spans.bytes
    values.update(_memory())
    tracker.optimizer_end(values)


def _grad_norm(optimizer: Any) -> Any:
    """The global L2 norm of the gradients the optimizer is about to apply."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads)
    return late.scalar(torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms])))


def _memory() -> dict[str, int]:
    """CUDA caching-allocator figures; these are host-side counters, no sync."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
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
