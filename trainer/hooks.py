"""Where a rank is measured: the torch hooks that feed the step tracker.

Installed once, right after the script imports torch (see runtime.py), so the
script runs unchanged: DDP's call, backward(), GradScaler, clip_grad_norm_ and
the global optimizer step hooks. Every change to torch goes through
patches.py, every private name through torchapi.py. Why each hook is where it
is, and what a step costs: docs/design.md, "the hooks". This module imports
torch at the top: runtime.py imports it only once the script's own
`import torch` has finished.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import inspect
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddptop.core.policy import GuardPolicy
from ddptop.trainer import (
    batch,
    fsdp1,
    importwatch,
    loss,
    optimizer_step,
    patches,
    pipelining,
    sharded_forward,
    steps,
    torchapi,
    warning_place,
)
from ddptop.trainer.probe import SCALED_KEPT, Probe
from ddptop.trainer.profiling import Captures
from ddptop.trainer.sampled import Sampled
from ddptop.trainer.steps import StepTracker


def install(tracker: StepTracker, policy: GuardPolicy, sampled: Sampled | None = None, captures: Captures | None = None) -> Probe:
    probe = Probe(tracker, policy, sampled, captures)
    probe.notice = lambda text: tracker.event({"type": "rank_note", "rank": tracker.rank, "wall": time.time(), "text": text})
    warning_place.install()
    _mark_group_joined(tracker)
    _wrap_ddp(probe)
    _wrap_data_parallel(probe)
    outermost = sharded_forward.Outermost(probe)
    sharded_forward.install(probe, outermost)
    fsdp1.install(probe, outermost)
    pipelining.install(probe)
    _wrap_grad_scaler(probe)
    _wrap_clip_grad_norm(probe)
    _wrap_backward(probe)
    patches.registered(
        "torch.optim global step pre-hook",
        register_optimizer_step_pre_hook(functools.partial(optimizer_step.begin, probe)),
    )
    patches.registered(
        "torch.optim global step post-hook",
        register_optimizer_step_post_hook(functools.partial(optimizer_step.end, probe)),
    )
    importwatch.after_import("torch._dynamo", _skipped_by_torch_compile)
    atexit.register(keep_groups, probe)
    return probe


def _skipped_by_torch_compile() -> None:
    """torch.compile runs ddptop's hooks as they are (torchapi.dynamo_skips says why)."""
    skip = torchapi.dynamo_skips("ddptop.trainer")
    if skip is not None:
        patches.registered("torch.compile's skip list: ddptop.trainer", skip)


def keep_groups(probe: Probe) -> None:
    """Let the DDP models' process groups outlive the interpreter.

    A gloo process group destroyed with the GIL held joins gloo's threads,
    and one of them may be waiting for the GIL to free the thread-local
    state of a finished work: a deadlock (py-spy on a rank hung as a
    script's main() returned, 3 CPU ranks: the main thread in
    ~ProcessGroupGloo joining pt_gloo_runloop, which waits in
    gil_scoped_acquire inside ~AsyncWork). So the probe holds each DDP
    model's group (a model freed frees no group), and at exit, before the
    interpreter finalizes, a reference that is never given back keeps each
    one: the process ends without destroying them, as it would be killed.
    """
    for group in probe.groups.values():
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))


def _mark_group_joined(tracker: StepTracker) -> None:
    """A phase record once init_process_group returns: how long joining the group took at a (re)start."""
    original = torch.distributed.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        tracker.event({"type": "phase", "rank": tracker.rank, "wall": time.time(), "phase": "group"})
        return result

    patches.replace(torch.distributed, "init_process_group", init_process_group)


def _wrap_ddp(probe: Probe) -> None:
    """Know every DDP model, leaving what the script can see of it as plain DDP
    would: nothing of ddptop's is stored on it, so a copy or pickle works, and a
    copy is known anew."""
    original_init = DistributedDataParallel.__init__
    original_setstate = DistributedDataParallel.__setstate__
    original_call = DistributedDataParallel._call_impl

    # --bucket-view: DDP's gradient_as_bucket_view, where the script did not say, by name or by
    # place (its place among the arguments after self: 9 in torch 2.3, 10 once init_sync came).
    named = list(inspect.signature(original_init).parameters) if probe.policy.bucket_view else []
    place = named.index("gradient_as_bucket_view") - 1 if "gradient_as_bucket_view" in named else -1

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) <= place:
            kwargs.setdefault("gradient_as_bucket_view", True)
        original_init(self, *args, **kwargs)
        _known(self, probe)

    @functools.wraps(original_setstate)
    def __setstate__(self: Any, state: dict[str, Any]) -> None:
        original_setstate(self, state)
        _known(self, probe)

    # Patching the class is the point: every DDP model the script builds is measured.
    for name, new in (
        ("__init__", __init__),
        ("_call_impl", _measured_forward(original_call, probe)),
        ("__setstate__", __setstate__),
    ):
        patches.replace(DistributedDataParallel, name, new)


def _known(model: Any, probe: Probe) -> None:
    """A new DDP model: its parameters for checksums, its timings for the sampler."""
    probe.models = [ref for ref in probe.models if ref() is not None] + [weakref.ref(model)]
    group = getattr(model, "process_group", None)
    if group is not None:
        probe.world = group.size()
        probe.groups[id(group)] = group
        if group.size() < torch.distributed.get_world_size():  # DDP over one pipeline stage's or shard's replicas
            probe.data_parallel_over(torch.distributed.get_process_group_ranks(group))
    probe.sampled.add_model(model)


def _wrap_grad_scaler(probe: Probe) -> None:
    """Know what GradScaler scaled the loss by and whether it has unscaled the gradients,
    and end the step it skips: optimizer.step() never runs for it (unless fused)."""
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_class is None:
        return
    original_step, original_scale, original_unscale = scaler_class.step, scaler_class.scale, scaler_class.unscale_

    @functools.wraps(original_scale)
    def scale(self: Any, outputs: Any) -> Any:
        scaled = original_scale(self, outputs)
        factor = torchapi.scaler_scale(self)
        if scaled is outputs or factor is None:  # a disabled scaler scales nothing
            return scaled
        probe.scaler.scale, probe.scaler.unscaled = factor, False
        if isinstance(scaled, torch.Tensor):
            probe.scaler.scaled[id(scaled)] = (weakref.ref(scaled), id(outputs))
            if len(probe.scaler.scaled) > SCALED_KEPT:
                del probe.scaler.scaled[next(iter(probe.scaler.scaled))]
        return scaled

    @functools.wraps(original_unscale)
    def unscale_(self: Any, optimizer: Any) -> Any:
        result = original_unscale(self, optimizer)
        probe.scaler.unscaled = True
        return result

    @functools.wraps(original_step)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = probe.tracker.step
        result = original_step(self, optimizer, *args, **kwargs)
        if probe.tracker.step == before:
            probe.tracker.scaler_skip(optimizer_step.losses_only(probe))
            if probe.models:
                probe.between.arm()
        return result

    for name, new in (("scale", scale), ("unscale_", unscale_), ("step", step)):
        patches.replace(scaler_class, name, new)


def _wrap_clip_grad_norm(probe: Probe) -> None:
    """The norm the script's own clip_grad_norm_ returns is the pre-clip norm the step
    shows: once it has clipped, the gradients the optimizer gets are under it. Where it
    measured every gradient the optimizer steps, it is the guard's norm too (_guard).

    A script may take the norm and clip in two calls, as torchtitan does to add its
    pipeline stages' norms between them: get_total_norm, then clip_grads_with_norm_
    (torch 2.6 and later), whose total_norm is then the step's norm. clip_grad_norm_
    calls their private forms, so a step's one clip counts once either way."""
    from torch.nn.utils import clip_grad

    clip_grad_norm_ = _clip(clip_grad.clip_grad_norm_, probe, norm_given=False)
    patches.replace(clip_grad, "clip_grad_norm_", clip_grad_norm_)
    patches.replace(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)
    with_norm = getattr(torch.nn.utils, "clip_grads_with_norm_", None)
    if with_norm is not None:
        patches.replace(torch.nn.utils, "clip_grads_with_norm_", _clip(with_norm, probe, norm_given=True))


def _clip(original: Callable[..., Any], probe: Probe, norm_given: bool) -> Callable[..., Any]:
    """A clip that tells the probe the parameters it clipped and their pre-clip norm: the one it
    returns, or where norm_given, its total_norm argument. One function, no call of its own
    beside the clip: a script that clips calls it every step."""

    @functools.wraps(original)
    def clip(*args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("parameters", ())
        if isinstance(given, torch.Tensor):
            clipped = [given]
        elif isinstance(given, list):
            clipped = given
        else:  # model.parameters() can be read once: read here, and handed on as a list
            clipped = list(given)
            args, kwargs = ((clipped, *args[1:]), kwargs) if args else (args, {**kwargs, "parameters": clipped})
        result = original(*args, **kwargs)
        norm = (args[2] if len(args) > 2 else kwargs["total_norm"]) if norm_given else result
        probe.clip.clipped = clipped
        probe.clip.clips += 1
        whole = norm
        if type(norm) is not torch.Tensor and torchapi.is_dtensor(norm):  # a plain norm costs no call
            # Of sharded gradients, a DTensor that clipping has reduced to replicated: its local tensor is the whole norm.
            whole = torchapi.replicated(norm).to_local()
        probe.clip.script_norm = (whole, probe.scaler.scale is not None and not probe.scaler.unscaled) if probe.clip.clips == 1 else None
        return result

    return clip


def _wrap_backward(probe: Probe) -> None:
    """The step's loss with no line of the script changed: what it called backward() on.

    torch.autograd.backward is wrapped; Tensor.backward calls it. Once the
    original returns (a backward that raised records nothing), what it was
    called on is handed to the tracker, if a training forward of a DDP model
    ran since the last step ended (a backward outside any DDP step is not the
    step's loss), or if no DDP forward has run (composable replicate(), one
    process alone; an FSDP2 model's outermost forward counts as DDP's:
    sharded_forward.py), and the step's loss is the sum of each scalar, real
    floating-point tensor among them. So gradient accumulation sums its
    micro-steps, as the script's own loop optimises them (a loop that divides
    each micro-batch's loss by the accumulation steps gets the step's mean),
    and a second backward in one step (a GAN's two losses, retain_graph) adds
    to it. A backward on a non-scalar (with a gradient), integer or complex
    tensor records nothing for it, and neither does a backward that a backward
    runs (torch.utils.checkpoint's reentrant one, on its segment's outputs).
    monitor.step(loss=...) wins.

    The wrapper only hands the tensor over: it is read with the guard's pack
    (guard.py), a step late on a GPU. A loss a GradScaler scaled is marked
    (ScalerSeen.scaled_at), and the pack carries the scale to divide it by. The
    usual backward, one scalar loss and no scaler, costs one call and no op.
    """
    original = torch.autograd.backward
    tracker, tensor_type, graph_task = probe.tracker, torch.Tensor, torchapi.current_graph_task_id

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        tracker.phase = "backward"
        one = isinstance(tensors, tensor_type)
        if not one:
            tensors = tuple(tensors)  # the original takes any iterable: read it once, for both
        result = original(tensors, *args, **kwargs)
        # A job whose DDP forward never ran (composable replicate()'s) has none to begin its
        # steps: its losses count from any backward, up to LOSSES_KEPT in a step (a loop no optimizer
        # closes holds no more); a DDP forward that begins a step drops those before it (steps.py).
        if not tracker.in_step and (tracker.forwards or len(tracker.losses) >= steps.LOSSES_KEPT):
            return result
        if graph_task() != -1:  # called by a backward running (a reentrant checkpoint's recomputation): not a loss
            return result
        if one and not probe.scaler.scaled and not tensors.dim() and tensors.is_floating_point():
            tracker.losses.append(tensors)
            tracker.loss_ids.append(id(tensors))
            return result
        for tensor in (tensors,) if one else tensors:
            if isinstance(tensor, tensor_type) and loss.is_loss(tensor):
                loss.hand_over(probe, tensor)
        return result

    patches.replace(torch.autograd, "backward", backward)


def _wrap_data_parallel(probe: Probe) -> None:
    """One process driving several GPUs (nn.DataParallel) has steps too: its
    model's training forwards start them, as a DDP model's do."""
    patches.replace(torch.nn.DataParallel, "forward", _measured_forward(torch.nn.DataParallel.forward, probe))


def _measured_forward(original: Callable[..., Any], probe: Probe) -> Callable[..., Any]:
    """A model class's forward (or call) that counts every forward and begins (or adds to) a
    step at a training one: with grad, the wrapper or the model it wraps in train mode.

    The wrapped model's mode is what the forward runs in (dropout, batch norm), and
    the wrapper's may be stale: Lightning's validation calls eval() on the DDP wrapper
    and then puts only the LightningModule's modes back, so every training step after
    the first validation runs through a wrapper in eval mode. The wrapped model is read
    from _modules, as nn.Module's own lookup of `self.module` is a Python call.

    Any other forward between two steps is an evaluation's: the phase says "eval", not
    the "data" a step's end left, so a rank validating is not shown waiting for data
    (and a crash in it is said to be in it), and its span is the next step's record's
    own, not its data wait (steps.py). One within a step (a frozen teacher's) is part
    of that step's work. Every forward here ends the look for an evaluation that
    passes by DDP (between_steps.py): a C call, no hook."""
    tracker, token_dtypes, between = probe.tracker, batch.TOKEN_DTYPES, probe.between
    grad_enabled, tensor_type = torch.is_grad_enabled, torch.Tensor  # looked up once, not at every forward
    pre_hooks, key = between.hooks, between.key

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        pre_hooks.pop(key, None)
        tracker.forwards += 1
        if (self.training or self._modules["module"].training) and grad_enabled():
            if between.watched is not None:
                between.settle()
            if args and not kwargs and isinstance(first := args[0], tensor_type) and (shape := first.shape):  # model(x)
                tokens = shape[0] * shape[1] if len(shape) == 2 and first.dtype in token_dtypes else None
                tracker.forward_begin(shape[0], tokens, id(self))
            else:
                tracker.forward_begin(batch.size(args, kwargs), batch.tokens(args, kwargs), id(self))
        elif not tracker.in_step:
            tracker.evaluating()
            result = original(self, *args, **kwargs)
            tracker.evaluated()
            return result
        return original(self, *args, **kwargs)

    return forward
