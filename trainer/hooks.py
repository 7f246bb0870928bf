"""Where a rank is measured: the torch hooks that feed the step tracker.

Installed once, right after the script imports torch (see runtime.py), so
the script runs unchanged. Every change to torch goes through patches.py
(listed there, with its undo), and the few private attributes of torch it
reads are in torchapi.py, checked against the running torch.

The hot path is the same on the CPU and on a GPU, and it is short: each
Python call and torch op on the training thread is time a GPU job loses.
DDP keeps its own C++ all-reduce (ddptop registers no comm hook), so no
Python runs per bucket; comm time comes from what DDP already measures
(sampled.py, off the training thread). Per step:

- DistributedDataParallel.forward is wrapped (step start, samples, tokens,
  phase), in the class rather than as module hooks: a module with hooks
  takes nn.Module's slow call path, which costs more than the wrapper;
- torch.autograd.backward is wrapped: what it was called on is the step's
  loss (its tensor handed over, read with the guard's pack);
- the global optimizer step pre/post hooks mark the step boundary and run
  the in-rank watchdog (guard.py): one fused norm of the gradients, packed
  with the losses into one copy to the host, the NaN/Inf skip where the
  policy asks, clipping on the device, and every few steps a checksum;
- GradScaler.scale, unscale_ and step, and clip_grad_norm_, are wrapped to
  know what the gradients were scaled by, and the norm the script clipped
  at, so the norm shown is the unscaled pre-clip one; a step the scaler
  skips on purpose (inf in fp16 gradients) still ends, marked as such.

This module imports torch at the top: runtime.py imports it only from the
callback that runs once the script's own `import torch` has finished.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddptop.trainer import guard, late, patches, torchapi
from ddptop.trainer.policy import GuardPolicy
from ddptop.trainer.profiling import Captures
from ddptop.trainer.sampled import Sampled
from ddptop.trainer.steps import StepTracker


class Probe:
    """What the hooks of one rank share: where records go, the policy, the DDP
    models (for checksums and DDP's own timings), and what the step so far told."""

    def __init__(self, tracker: StepTracker, policy: GuardPolicy, sampled: Sampled | None = None, captures: Captures | None = None) -> None:
        self.tracker = tracker
        self.captures = captures if captures is not None else Captures(tracker.rank, 0, lambda record: None)
        """Profiler captures asked of this rank (profiling.py): run at step boundaries."""
        self.captures.models = self.ddp_models
        self.policy = policy
        self.skips = policy.skips
        """policy.skips, read once: an attribute costs the step no call."""
        self.sampled = sampled if sampled is not None else Sampled()
        self.models: list[weakref.ref[Any]] = []
        """The DDP models, weakly: their parameters are what the checksum covers."""
        self.world = 1
        """The DDP models' group size: at 1 a non-finite gradient is this rank's own."""
        self.groups: dict[int, Any] = {}
        """The DDP models' process groups, held to the rank's end and past it (keep_groups says why)."""
        self.scale: torch.Tensor | None = None
        """The scale a GradScaler multiplied this step's loss by (None: no scaler, or a disabled one)."""
        self.unscaled = False
        """Whether GradScaler.unscale_ ran since that scale(): the gradients are unscaled."""
        self.script_norm: tuple[torch.Tensor, bool] | None = None
        """What the script's clip_grad_norm_ returned this step, and whether the gradients it
        measured were still scaled; two calls in one step leave None (their norms are parts)."""
        self.clips = 0
        self.clipped: list[Any] = []
        """The parameters the script's clip_grad_norm_ was given this step (not held past it)."""
        self.covers: dict[tuple[int, ...], bool] = {}
        """Whether a script's clip covered every gradient an optimizer steps, by (optimizer, gradients,
        parameters clipped, first and last of them): found once, then looked up without a call."""
        self.inf_flag: torch.Tensor | None = None
        """The found_inf ddptop hands a fused optimizer, made once and written on the device each step."""
        self.resume_seen = False
        """Whether the first optimizer step has looked for a script's own resume (once a process)."""
        self.stepping: Any = None
        """The optimizer whose step() is running. One that raised is left
        here, and its next step() begins afresh."""
        self.found_inf_set: Any = None
        """The optimizer ddptop handed a found_inf to for the step running (taken back after it)."""
        self.cuda = False
        """Whether the latest step's gradients were on a GPU."""
        self.scaled_at: list[int] = []
        """Which of the step's losses (tracker.losses, by position) a GradScaler scaled."""
        self.scaled: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        """Tensors a GradScaler scaled, by id, with the id of the tensor they were scaled from
        (the latest SCALED_KEPT kept): the loss that goes to backward() is read unscaled, and
        monitor.step(loss=) of the unscaled one is known to be the same loss."""
        self.notice: Callable[[str], None] = lambda text: None
        """Where a one-time notice goes (the supervisor's alert panel, through the tracker)."""
        self.noticed: set[str] = set()

    def ddp_models(self) -> list[Any]:
        return [model for ref in self.models if (model := ref()) is not None]

    def parameters(self) -> list[torch.Tensor]:
        return [p for ref in self.models if (model := ref()) is not None for p in model.module.parameters()]

    def tell_once(self, key: str, text: str) -> None:
        if key not in self.noticed:
            self.noticed.add(key)
            self.notice(text)


SCALED_KEPT = 16


def install(tracker: StepTracker, policy: GuardPolicy, sampled: Sampled | None = None, captures: Captures | None = None) -> Probe:
    probe = Probe(tracker, policy, sampled, captures)
    probe.notice = lambda text: tracker.event({"type": "rank_note", "rank": tracker.rank, "wall": time.time(), "text": text})
    _mark_group_joined(tracker)
    _wrap_ddp(probe)
    _wrap_data_parallel(probe)
    _wrap_grad_scaler(probe)
    _wrap_clip_grad_norm(probe)
    _wrap_backward(probe)
    patches.registered(
        "torch.optim global step pre-hook",
        register_optimizer_step_pre_hook(functools.partial(_optimizer_begin, probe)),
    )
    patches.registered(
        "torch.optim global step post-hook",
        register_optimizer_step_post_hook(functools.partial(_optimizer_end, probe)),
    )
    atexit.register(keep_groups, probe)
    return probe


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
    original_forward = DistributedDataParallel.forward

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        _known(self, probe)

    @functools.wraps(original_setstate)
    def __setstate__(self: Any, state: dict[str, Any]) -> None:
        original_setstate(self, state)
        _known(self, probe)

    # Patching the class is the point: every DDP model the script builds is measured.
    for name, new in (
        ("__init__", __init__),
        ("forward", _measured_forward(original_forward, probe)),
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
        probe.scale, probe.unscaled = factor, False
        if isinstance(scaled, torch.Tensor):
            probe.scaled[id(scaled)] = (weakref.ref(scaled), id(outputs))
            if len(probe.scaled) > SCALED_KEPT:
                del probe.scaled[next(iter(probe.scaled))]
        return scaled

    @functools.wraps(original_unscale)
    def unscale_(self: Any, optimizer: Any) -> Any:
        result = original_unscale(self, optimizer)
        probe.unscaled = True
        return result

    @functools.wraps(original_step)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = probe.tracker.step
        result = original_step(self, optimizer, *args, **kwargs)
        if probe.tracker.step == before:
            probe.tracker.scaler_skip(_losses_only(probe))
        return result

    for name, new in (("scale", scale), ("unscale_", unscale_), ("step", step)):
        patches.replace(scaler_class, name, new)


def _wrap_clip_grad_norm(probe: Probe) -> None:
    """The norm the script's own clip_grad_norm_ returns is the pre-clip norm the step
    shows: once it has clipped, the gradients the optimizer gets are under it. Where it
    measured every gradient the optimizer steps, it is the guard's norm too (_guard)."""
    from torch.nn.utils import clip_grad

    original = clip_grad.clip_grad_norm_

    @functools.wraps(original)
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("parameters", ())
        if isinstance(given, torch.Tensor):
            clipped = [given]
        elif isinstance(given, list):
            clipped = given
        else:  # model.parameters() can be read once: read here, and handed on as a list
            clipped = list(given)
            args, kwargs = ((clipped, *args[1:]), kwargs) if args else (args, {**kwargs, "parameters": clipped})
        norm = original(*args, **kwargs)
        probe.clipped = clipped
        probe.clips += 1
        probe.script_norm = (norm, probe.scale is not None and not probe.unscaled) if probe.clips == 1 else None
        return norm

    patches.replace(clip_grad, "clip_grad_norm_", clip_grad_norm_)
    patches.replace(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)


def _wrap_backward(probe: Probe) -> None:
    """The step's loss with no line of the script changed: what it called backward() on.

    torch.autograd.backward is wrapped; Tensor.backward calls it. Once the
    original returns (a backward that raised records nothing), what it was
    called on is handed to the tracker, if a training forward of a DDP model
    ran since the last step ended (a backward outside any DDP step is not the
    step's loss), and the step's loss is the sum of each scalar, real
    floating-point tensor among them. So gradient accumulation sums its
    micro-steps, as the script's own loop optimises them (a loop that divides
    each micro-batch's loss by the accumulation steps gets the step's mean),
    and a second backward in one step (a GAN's two losses, retain_graph) adds
    to it. A backward on a non-scalar (with a gradient), integer or complex
    tensor records nothing for it. monitor.step(loss=...) wins.

    The wrapper only hands the tensor over: it is read with the guard's pack
    (guard.py), a step late on a GPU. A loss a GradScaler scaled is marked
    (Probe.scaled_at), and the pack carries the scale to divide it by. The
    usual backward, one scalar loss and no scaler, costs one call and no op.
    """
    original = torch.autograd.backward
    tracker, tensor_type = probe.tracker, torch.Tensor

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        one = isinstance(tensors, tensor_type)
        if not one:
            tensors = tuple(tensors)  # the original takes any iterable: read it once, for both
        result = original(tensors, *args, **kwargs)
        if not tracker.in_step:
            return result
        if one and not probe.scaled and not tensors.dim() and tensors.is_floating_point():
            tracker.losses.append(tensors)
            tracker.loss_ids.append(id(tensors))
            return result
        for tensor in (tensors,) if one else tensors:
            if isinstance(tensor, tensor_type) and late.is_loss(tensor):
                _hand_over(probe, tensor)
        return result

    patches.replace(torch.autograd, "backward", backward)


def _hand_over(probe: Probe, tensor: torch.Tensor) -> None:
    """One loss to the step, as a 0-d tensor, marked if a GradScaler scaled it."""
    tracker = probe.tracker
    known = probe.scaled.get(id(tensor)) if probe.scaled else None
    if known is not None and known[0]() is tensor:
        probe.scaled_at.append(len(tracker.losses))
        tracker.loss_ids.append(known[1])
    else:
        tracker.loss_ids.append(id(tensor))
    tracker.losses.append(tensor.reshape(()) if tensor.dim() else tensor)


def _wrap_data_parallel(probe: Probe) -> None:
    """One process driving several GPUs (nn.DataParallel) has steps too: its
    model's training forwards start them, as a DDP model's do."""
    patches.replace(torch.nn.DataParallel, "forward", _measured_forward(torch.nn.DataParallel.forward, probe))


def _measured_forward(original: Callable[..., Any], probe: Probe) -> Callable[..., Any]:
    """A model class's forward that counts every forward and begins (or adds to) a
    step at a training one (in train mode, with grad)."""
    tracker = probe.tracker

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracker.forwards += 1
        if self.training and torch.is_grad_enabled():
            if args and not kwargs and isinstance(first := args[0], torch.Tensor) and (shape := first.shape):  # model(x)
                tokens = shape[0] * shape[1] if len(shape) == 2 and first.dtype in _TOKEN_DTYPES else None
                tracker.forward_begin(shape[0], tokens)
            else:
                tracker.forward_begin(_batch_size(args, kwargs), _tokens(args, kwargs))
        output = original(self, *args, **kwargs)
        tracker.phase = "backward"
        return output

    return forward


def _optimizer_begin(probe: Probe, optimizer: Any, args: Any = None, kwargs: Any = None) -> tuple[Any, Any] | None:
    """A training step's optimizer step begins, unless another optimizer's
    step is running: one stepped from inside it (ZeroRedundancyOptimizer's
    local optimizer) is part of that step, which the outer one ends.

    A step given a closure (PyTorch Lightning's, LBFGS's) runs its forward
    and backward inside step(), after this hook: the closure is wrapped so
    that the guard sees the gradients it makes, before the update."""
    if probe.stepping is not None and probe.stepping is not optimizer:
        return None
    probe.stepping = optimizer
    closure = kwargs.get("closure") if kwargs else None
    if closure is None and len(args) > 1 and callable(args[1]):  # torch passes the step's args with the optimizer first
        closure = args[1]
    if closure is None:
        _guarded(probe, optimizer)
        return None

    def guarded_closure() -> Any:
        result = closure()
        _guarded(probe, optimizer)
        return result

    if kwargs and "closure" in kwargs:
        return args, {**kwargs, "closure": guarded_closure}
    return (args[0], guarded_closure, *args[2:]), kwargs


def _guarded(probe: Probe, optimizer: Any) -> None:
    """The guard, once the step's gradients are made; and a script's own resume, at the first step."""
    values = _guard(probe, optimizer)
    if not probe.resume_seen:
        probe.resume_seen = True
        _follow_the_scripts_resume(probe, optimizer)
    probe.tracker.optimizer_begin(values)


RESUMED_FROM = "its optimizer's state (the script's own checkpoint)"


def _follow_the_scripts_resume(probe: Probe, optimizer: Any) -> None:
    """Steps go on from where a script that resumes itself goes on.

    A script that restores its own checkpoint (nanoGPT's ckpt.pt, a
    Trainer's resume_from_checkpoint) loads its optimizer's state before the
    first step of the attempt; the step count Adam-like optimizers keep there
    is the steps done, so ddptop's next step is that count, as under
    monitor.resume. An optimizer that keeps no count (plain SGD) says nothing:
    then ddptop's steps count from 0 in each attempt. A count on a GPU is not
    read: that would wait for the device.
    """
    count = next((state.get("step") for state in optimizer.state.values()), None)
    if isinstance(count, torch.Tensor):
        if count.device.type != "cpu" or count.numel() != 1:
            return
        count = count.item()
    if not isinstance(count, (int, float)) or count <= probe.tracker.step:
        return
    tracker = probe.tracker
    tracker.resumed_at(int(count))
    tracker.event(
        {"type": "resume", "rank": tracker.rank, "wall": time.time(), "step": int(count) - 1, "path": RESUMED_FROM, "damaged": []}
    )


def _guard(probe: Probe, optimizer: Any) -> dict[str, Any]:
    """The guard, before the optimizer sees the gradients: the step record's values.

    One fused norm per gradient, packed with the step's losses and scales
    into one tensor, one copy to the host (guard.py says what is in it). The
    verdict is read now where the step may have to be skipped on the host
    (the CPU, where reading waits for nothing; `--on-nan skip` on a GPU with
    an optimizer that takes no found_inf); a fused optimizer on a GPU is
    handed the verdict as its found_inf, on the device; otherwise the
    values are read a step late.

    One function rather than a chain of them on purpose: it runs once a step
    between torch's kernels, where every function called pays its own cold
    start, so the usual step calls only torch.
    """
    tracker, policy = probe.tracker, probe.policy
    scale, probe.scale = probe.scale, None
    script, clipped = probe.script_norm, probe.clipped
    if probe.clips:  # the script's clip is this step's alone, and its parameters are not held past it
        probe.script_norm, probe.clips, probe.clipped = None, 0, []
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:  # no parameter has a gradient this step: nothing to check or clip, only its losses
        probe.scale = scale
        return _losses_only(probe)
    losses, tracker.losses = tracker.losses, []
    first = grads[0]
    probe.cuda = cuda = first.is_cuda
    if cuda and probe.sampled.device is None:
        probe.sampled.device = first.device.index
    grad_scale = getattr(optimizer, "grad_scale", None)  # a fused optimizer under GradScaler.step: still scaled
    scaler_inf = getattr(optimizer, "found_inf", None)
    clip = policy.clip_grad
    on_device = cuda and probe.skips and scaler_inf is None and getattr(optimizer, "_step_supports_amp_scaling", False)
    # The script's own norm of unscaled gradients is the step's, where it measured all of them
    # (an fp16 norm is not: it overflows where the gradients do not).
    borrowed: torch.Tensor | None = None
    if script is not None and clip is None and grad_scale is None and not script[1] and clipped and script[0].dtype is not torch.float16:
        key = (id(optimizer), len(grads), len(clipped), id(clipped[0]), id(clipped[-1]))
        covers = probe.covers.get(key)
        if covers is None:
            covers = _script_covers(probe, optimizer, clipped, key)
        if covers:
            borrowed, script = script[0], None
    if borrowed is not None:
        parts = [borrowed]
    else:
        parts = guard.norms(grads)
        if clip is not None or on_device:
            parts = [guard.total(parts)]
            if clip is not None:
                guard.clip_on_device(grads, parts[0] if grad_scale is None else parts[0] / grad_scale, clip)
    if on_device:
        flag = probe.inf_flag
        if flag is None or flag.device != first.device:
            flag = probe.inf_flag = torch.empty((), dtype=torch.float32, device=first.device)
        optimizer.found_inf = guard.found_inf(parts[0], flag)
        probe.found_inf_set = optimizer
    norms = len(parts)
    if script is not None:
        parts.append(script[0])
    marks = _scaled_marks(probe, len(losses)) if probe.scaled_at else (False,) * len(losses)  # the usual step: no call
    parts += losses
    has_scale = False
    if scale is not None and (True in marks or bool(script and script[1])):
        parts.append(scale)
        has_scale = True
    if grad_scale is not None:
        parts.append(grad_scale)
    if scaler_inf is not None:
        parts.append(scaler_inf)
    checksum = bool(policy.desync_every) and tracker.step % policy.desync_every == 0
    if checksum:
        parts += guard.checksum_parts(probe.parameters() or [p for g in optimizer.param_groups for p in g["params"]])
    arrangement = (norms, script is not None, bool(script and script[1]), marks, has_scale, grad_scale is not None,
                   scaler_inf is not None, checksum, clip, probe.world == 1, on_device)  # fmt: skip
    fields = _FIELDS.get(arrangement)
    if fields is None:
        fields = _FIELDS[arrangement] = guard.Layout(*arrangement).fields
    grad_mode = torch.is_grad_enabled()
    if grad_mode:  # the losses still have their graphs: the pack needs none
        torchapi.set_grad_enabled(False)
    packed = guard.pack(parts)
    if grad_mode:
        torchapi.set_grad_enabled(True)
    if not cuda or (policy.waits(cuda) and not on_device and scaler_inf is None):
        values: dict[str, Any] = fields(packed.tolist())
        if probe.skips and values.get("nonfinite"):
            guard.skip(optimizer)
            values["skipped"] = "nan"
        return values
    if policy.on_nan == "auto" and not on_device and scaler_inf is None:
        probe.tell_once("late", NAN_APPLIED_NOTICE.format(name=type(optimizer).__name__))
    return {late.FIELDS: late.RING.send(packed, fields)}


_FIELDS: dict[tuple[Any, ...], Any] = {}
"""Each arrangement's Layout.fields, looked up without a call: the usual step has the last one's."""


NAN_APPLIED_NOTICE = (
    "{name} on a GPU takes no found_inf tensor, so a non-finite step is seen a step late and "
    "reaches the weights; --on-nan skip skips it exactly, at a wait for the backward pass every step"
)


COVERS_KEPT = 16


def _script_covers(probe: Probe, optimizer: Any, clipped: list[Any], key: tuple[int, ...]) -> bool:
    """Whether the parameters the script's clip_grad_norm_ was given hold every gradient the
    optimizer steps: then its norm is the guard's (a clip of some of them leaves the rest
    unmeasured). Found once for each arrangement (key: Probe.covers) and kept."""
    given = {id(param) for param in clipped}
    covers = all(id(param) in given for group in optimizer.param_groups for param in group["params"] if param.grad is not None)
    if len(probe.covers) >= COVERS_KEPT:
        probe.covers.clear()
    probe.covers[key] = covers
    return covers


def _scaled_marks(probe: Probe, count: int) -> tuple[bool, ...]:
    """Which of the step's count losses a GradScaler scaled, taken off the probe for the next step."""
    marks = tuple(i in probe.scaled_at for i in range(count))
    probe.scaled_at = []
    return marks


def _losses_only(probe: Probe) -> dict[str, Any]:
    """The values of a step with no gradients (a GradScaler skipped its optimizer): the losses, unscaled."""
    tracker = probe.tracker
    losses, tracker.losses = tracker.losses, []
    scale, probe.scale = probe.scale, None
    probe.script_norm, probe.clips, probe.clipped = None, 0, []
    marks = _scaled_marks(probe, len(losses))
    if not losses:
        return {}
    parts = [loss.detach() for loss in losses]
    has_scale = scale is not None and True in marks
    if has_scale:
        parts.append(scale)
    fields = guard.Layout(0, False, False, marks, has_scale, False, False, False, None, probe.world == 1).fields
    packed = guard.pack(parts)
    return {late.FIELDS: late.RING.send(packed, fields)} if packed.is_cuda else fields(packed.tolist())


def _optimizer_end(probe: Probe, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
    if optimizer is not probe.stepping:
        return
    probe.stepping = None
    if probe.found_inf_set is optimizer:
        del optimizer.found_inf
        probe.found_inf_set = None
    if probe.sampled.comm_due:  # once a second: the reducer is idle between steps (sampled.py)
        probe.sampled.read_comm()
    groups = optimizer.param_groups
    if groups and type(lr := groups[0].get("lr")) is float:  # a tensor one (capturable schedules) would need a device read
        probe.tracker.optimizer_end({"lr": lr})
    else:
        probe.tracker.optimizer_end({})
    if probe.captures.active:  # a capture asked for or running (profiling.py): a step boundary for it
        probe.captures.boundary(probe.tracker.step)


_TOKEN_DTYPES = frozenset(
    getattr(torch, name) for name in ("uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64") if hasattr(torch, name)
)
"""Integer dtypes, the ones token ids come in (not floats, complex numbers or bools)."""


def _tokens(args: tuple, kwargs: dict) -> int | None:
    """Elements of the forward's token ids: its `input_ids`, else its first positional
    tensor, when that is 2-D and of integers (images and 1-D labels are not tokens)."""
    ids = kwargs.get("input_ids") if kwargs else None
    if ids is None:
        ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if not isinstance(ids, torch.Tensor) or ids.dtype not in _TOKEN_DTYPES or ids.dim() != 2:
        return None
    return ids.numel()


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
