"""Where a rank is measured: the torch hooks that feed the step tracker.

Installed once, right after the script imports torch (see runtime.py), so
the script runs unchanged. Every change to torch goes through patches.py
(listed there, with its undo), and the few private attributes of torch it
reads are in torchapi.py, checked against the running torch:

- DistributedDataParallel.forward is wrapped (step start, samples, tokens,
  phase), in the class rather than as module hooks: a module with hooks
  takes nn.Module's slow call path, which costs more than the wrapper;
- at a model's first forward, if the script registered no comm hook of its
  own, a timed all-reduce with the semantics of DDP's default is registered;
  a comm hook the script registers itself is wrapped with the same timing
  (one registered after that first forward takes the default's place, as
  it would under plain DDP), and either way the reduced buckets are kept
  for the guard's norm;
- the global optimizer step pre/post hooks mark the step boundary and run
  the in-rank watchdog (guard.py): grad norm, NaN/Inf check (and skip where
  the policy asks), clipping, and every few steps a parameter checksum;
- GradScaler.step is wrapped so that a step the scaler skips on purpose
  (inf in fp16 gradients) still ends, marked as the scaler's skip.

This module imports torch at the top: runtime.py imports it only from the
callback that runs once the script's own `import torch` has finished.
"""

from __future__ import annotations

import atexit
import collections
import functools
import math
import operator
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddptop.trainer import commtimer, flightrecorder, guard, late, patches, threadstate, torchapi
from ddptop.trainer.gpumemory import MemoryReadings
from ddptop.trainer.policy import GuardPolicy
from ddptop.trainer.steps import COMM, StepTracker


class Probe:
    """What the hooks of one rank share: where records go, the policy, the
    comm timer, the pre-all-reduce check, the GPU memory readings and the
    DDP models (for checksums)."""

    def __init__(self, tracker: StepTracker, policy: GuardPolicy) -> None:
        self.tracker = tracker
        self.policy = policy
        self.skips_now = (policy.skips_now(cuda=False), policy.skips_now(cuda=True))
        """policy.skips_now by whether the gradients are on a GPU, decided once."""
        self.timer = commtimer.CommTimer()
        self.local = guard.LocalCheck()
        self.memory = MemoryReadings()
        self.reduced: weakref.WeakKeyDictionary[Any, guard.ReducedBuckets] = weakref.WeakKeyDictionary()
        self.owners: weakref.WeakKeyDictionary[Any, tuple[list[int], guard.ReducedBuckets | None]] = weakref.WeakKeyDictionary()
        self.last_owner: tuple[Callable[[], Any], list[Any] | None, int, guard.ReducedBuckets | None] = (lambda: None, None, 0, None)
        """The optimizer buckets_of answered for last (weakly), its list of groups and their
        count then, and the answer."""
        self.scale: torch.Tensor | None = None
        """The scale a GradScaler multiplied this step's loss by (None: no scaler, or a disabled one)."""
        self.resume_seen = False
        """Whether the first optimizer step has looked for a script's own resume (once a process)."""
        self.stepping: Any = None
        """The optimizer whose step() is running. One that raised is left
        here, and its next step() begins afresh."""
        self.callbacks: collections.deque[weakref.ref[Any]] = collections.deque(maxlen=CALLBACKS_KEPT)
        """The latest comm hook callbacks, to wait for gloo to let go of them (threadstate.py)."""
        self.defaults: weakref.WeakKeyDictionary[Any, DefaultHook] = weakref.WeakKeyDictionary()
        """The models running ddptop's default hook, until the script registers its own."""
        self.unstarted: set[int] = set()
        """The ids of the DDP models whose first forward has not run (it registers the comm hook)."""
        self.cuda = False
        """Whether the latest step's gradients were on a GPU (before the first, whether a DDP
        model is): only then is GPU memory read."""
        self.groups: dict[int, Any] = {}
        """The process groups of the DDP models, kept to the rank's end (threadstate.py says why)."""
        self.scaled: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        """Tensors a GradScaler scaled, by id, with the scale they were multiplied by: the
        loss that goes to backward() is divided back (the latest SCALED_KEPT kept)."""

    def buckets(self, model: Any) -> guard.ReducedBuckets:
        """The model's reduced buckets, made at first use: DDP's own __init__
        registers a comm hook for some options (mixed precision), before the
        wrapped __init__ below has seen the model."""
        if model not in self.reduced:
            ignored = getattr(model, "parameters_to_ignore", ())
            trainable = (p for name, p in model.module.named_parameters() if p.requires_grad and name not in ignored)
            views = bool(getattr(model, "gradient_as_bucket_view", False))
            group = getattr(model, "process_group", None)
            solo = group is not None and group.size() == 1
            cuda = any(p.is_cuda for p in model.module.parameters())
            self.cuda = self.cuda or cuda  # until a step's gradients say: a first step a GradScaler skips has none
            self.reduced[model] = guard.ReducedBuckets(trainable, views=views, solo=solo, cuda=cuda)
        return self.reduced[model]

    def parameters(self) -> Iterator[torch.Tensor]:
        for model in list(self.reduced):
            yield from model.module.parameters()

    def buckets_of(self, optimizer: Any) -> guard.ReducedBuckets | None:
        """The model whose bucketed parameters are exactly the optimizer's trainable
        ones, looked up again only when its groups change size.

        _guard asks only when `last_owner` does not answer: the same optimizer with
        the same list of groups, as many as then, the cheapest look there is at a
        step's start (add_param_group adds a group; a script that edits a group's
        own list of parameters in place is not seen until the count changes)."""
        groups = optimizer.param_groups
        shape = list(map(len, map(_PARAMS, groups)))
        known = self.owners.get(optimizer)
        if known is None or known[0] != shape:
            params = frozenset(id(p) for group in groups for p in group["params"] if p.requires_grad)
            owner = next((r for r in self.reduced.values() if r.params == params), None)
            known = (shape, owner)
            self.owners[optimizer] = known
        self.last_owner = (weakref.ref(optimizer), groups, len(groups), known[1])
        return known[1]


_PARAMS = operator.itemgetter("params")

CALLBACKS_KEPT = 1024
"""Callbacks whose release a rank waits for at exit: far more than a step's buckets in flight."""


def install(tracker: StepTracker, policy: GuardPolicy) -> None:
    probe = Probe(tracker, policy)
    _mark_group_joined(tracker)
    _wrap_ddp(probe)
    _wrap_data_parallel(probe)
    _wrap_grad_scaler(probe)
    _wrap_backward(probe)
    patches.registered(
        "torch.optim global step pre-hook",
        register_optimizer_step_pre_hook(functools.partial(_optimizer_begin, probe)),
    )
    patches.registered(
        "torch.optim global step post-hook",
        register_optimizer_step_post_hook(functools.partial(_optimizer_end, probe)),
    )
    atexit.register(_before_exit, probe)


def _mark_group_joined(tracker: StepTracker) -> None:
    """A phase record once init_process_group returns: how long joining the group took at a (re)start."""
    original = torch.distributed.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        tracker.event({"type": "phase", "rank": tracker.rank, "wall": time.time(), "phase": "group"})
        return result

    patches.replace(torch.distributed, "init_process_group", init_process_group)


def _before_exit(probe: Probe) -> None:
    """Let gloo's threads let go of the comm hooks' Python objects while the
    interpreter can still take them back (threadstate.py says why)."""
    threadstate.wait_for_release(probe.callbacks, EXIT_WAIT_S)
    threadstate.keep_past_exit(t for reduced in list(probe.reduced.values()) for t in reduced.held())
    threadstate.keep_past_exit(probe.groups.values())


EXIT_WAIT_S = 2.0
"""The longest a rank's exit waits for gloo to drop the last callbacks: only
a collective that never completes (a peer gone) keeps them that long."""

_original_register = DistributedDataParallel.register_comm_hook


def _wrap_ddp(probe: Probe) -> None:
    """Instrument every DDP model, leaving what the script can see of it as
    plain DDP would: its `_comm_hooks` list holds only the script's hooks, and
    it holds nothing of ddptop's (closures over this rank's probe, which
    neither copy nor pickle), so a copy or pickle works, and a copy is
    instrumented anew."""
    original_init = DistributedDataParallel.__init__
    original_setstate = DistributedDataParallel.__setstate__
    original_forward = DistributedDataParallel.forward

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        _instrument(self, probe)

    @functools.wraps(original_setstate)
    def __setstate__(self: Any, state: dict[str, Any]) -> None:
        original_setstate(self, state)
        _instrument(self, probe)

    @functools.wraps(_original_register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        default = probe.defaults.get(self)
        if default is None:
            _original_register(self, state, _timed(hook, probe, probe.buckets(self)))
            torchapi.comm_hooks(self)[-1] = (hook, state)
            return
        # ddptop's default went in at the first forward, and DDP takes one
        # hook per model: the script's goes behind it, with DDP's own checks
        # (a hook they refuse leaves the default in place, as plain DDP is
        # left with none), and a second one fails as it would under plain DDP.
        torchapi.check_comm_hook(self, hook)
        torchapi.name_comm_hook(self, hook.__qualname__)
        del probe.defaults[self]
        torchapi.comm_hooks(self).append((hook, state))
        default.state, default.hook = state, hook

    # Patching the class is the point: every DDP model the script builds is instrumented.
    for name, new in (
        ("__init__", __init__),
        ("forward", _measured_forward(original_forward, probe)),
        ("__setstate__", __setstate__),
        ("register_comm_hook", register_comm_hook),
    ):
        patches.replace(DistributedDataParallel, name, new)


def _instrument(model: Any, probe: Probe) -> None:
    """A new DDP model: its buckets, and a comm hook at its first forward."""
    probe.buckets(model)
    probe.unstarted.add(id(model))
    # The model's Reducer holds its process group, whose destructor joins gloo's threads with
    # the GIL held, while one of them may want the GIL to free a finished work or a comm hook's
    # callback: a deadlock when the model goes (a script's main() returning). So the group
    # outlives the model, and gloo's threads get the GIL to drop the callbacks as it goes.
    group = getattr(model, "process_group", None)
    if group is not None:
        probe.groups[id(group)] = group
    weakref.finalize(model, _forget, probe, id(model)).atexit = False


def _forget(probe: Probe, model_id: int) -> None:
    """A DDP model is freed: its id may be another's next, and gloo must drop its callbacks first."""
    probe.unstarted.discard(model_id)
    threadstate.wait_for_release(probe.callbacks, EXIT_WAIT_S)


SCALED_KEPT = 16


def _wrap_grad_scaler(probe: Probe) -> None:
    """End the step that GradScaler skips: optimizer.step() never runs for it. And
    remember what it scaled by, so the loss and the grad norm are recorded unscaled."""
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_class is None:
        return
    original_step = scaler_class.step
    original_scale = scaler_class.scale

    @functools.wraps(original_scale)
    def scale(self: Any, outputs: Any) -> Any:
        scaled = original_scale(self, outputs)
        factor = torchapi.scaler_scale(self)
        if scaled is outputs or factor is None:  # a disabled scaler scales nothing
            return scaled
        probe.scale = factor
        if isinstance(scaled, torch.Tensor):
            probe.scaled[id(scaled)] = (weakref.ref(scaled), factor)
            if len(probe.scaled) > SCALED_KEPT:
                del probe.scaled[next(iter(probe.scaled))]
        return scaled

    patches.replace(scaler_class, "scale", scale)

    @functools.wraps(original_step)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = probe.tracker.step
        result = original_step(self, optimizer, *args, **kwargs)
        if probe.tracker.step == before:
            probe.local.take()
            probe.scale = None
            probe.tracker.scaler_skip(_after_step(probe))
        return result

    patches.replace(scaler_class, "step", step)


def _wrap_backward(probe: Probe) -> None:
    """The step's loss with no line of the script changed: what it called backward() on.

    torch.autograd.backward is wrapped; Tensor.backward calls it. Once the
    original returns (a backward that raised records nothing), what it was
    called on is handed to the tracker, if a training forward of a DDP model
    ran since the last step ended (a backward outside any DDP step is not the
    step's loss), and the step's loss is the sum of each scalar, real
    floating-point tensor among them (late.losses). So gradient accumulation
    sums its micro-steps, as the script's own loop optimises them (a loop
    that divides each micro-batch's loss by the accumulation steps gets the
    step's mean), and a second backward in one step (a GAN's two losses,
    retain_graph) adds to it. A backward on a non-scalar (with a gradient),
    integer or complex tensor records nothing for it. monitor.step(loss=...)
    wins.

    The wrapper only hands the tensor over: it runs between the backward and
    the optimizer, where every line is paid cold, so the checks and the read
    wait for the step's close (late.losses; CUDA: summed on the device, read
    a step late). A loss GradScaler scaled is the exception: it is divided
    back by its scale at once, while the scale is known.
    """
    original = torch.autograd.backward
    tracker, tensor_type = probe.tracker, torch.Tensor

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        one = isinstance(tensors, tensor_type)
        if not one:
            tensors = tuple(tensors)  # the original takes any iterable: read it once, for both
        result = original(tensors, *args, **kwargs)
        if tracker.in_step:
            if one and not probe.scaled:
                tracker.losses.append(tensors)
            else:
                tracker.losses += _loss_values(probe, tensors)
        return result

    patches.replace(torch.autograd, "backward", backward)


def _loss_values(probe: Probe, tensors: Any) -> list[Any]:
    """A backward's values for the step's loss, unread, a GradScaler's scale divided back from
    each loss it scaled (a float where a CPU one was); the rest as they are, which late.losses
    leaves out as it does any value that cannot be a loss."""
    values: list[Any] = []
    for tensor in (tensors,) if isinstance(tensors, torch.Tensor) else tensors:
        known = probe.scaled.get(id(tensor))
        scale = known[1] if known is not None and known[0]() is tensor else None
        if scale is None or not late.is_loss(tensor):
            values.append(tensor)
        elif not tensor.is_cuda:
            values.append(tensor.item() / float(scale))
        else:
            values.append(tensor.detach().float().reshape(()) / scale.reshape(()))
    return values


def _wrap_data_parallel(probe: Probe) -> None:
    """One process driving several GPUs (nn.DataParallel) has steps too: its
    model's training forwards start them, as a DDP model's do; nothing is
    all-reduced, so there is no comm hook."""
    patches.replace(torch.nn.DataParallel, "forward", _measured_forward(torch.nn.DataParallel.forward, probe))


def _measured_forward(original: Callable[..., Any], probe: Probe) -> Callable[..., Any]:
    """A model class's forward that counts every forward, begins (or adds to) a
    step at a training one (in train mode, with grad), and at a DDP model's
    first forward registers the comm hook."""
    tracker, unstarted = probe.tracker, probe.unstarted

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if unstarted and id(self) in unstarted:
            unstarted.discard(id(self))
            _ensure_comm_hook(self, probe)
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


def _ensure_comm_hook(model: Any, probe: Probe) -> None:
    """Register a timed default all-reduce unless the script has a hook of its own.

    The default stays out of the model's `_comm_hooks`, as DDP's own
    all-reduce does: that list is the script's.
    """
    if torchapi.comm_hooks(model):
        return
    default = DefaultHook(model.process_group)
    try:
        _original_register(model, model.process_group, _timed(default, probe, probe.buckets(model)))
    except (RuntimeError, ValueError):
        # A built-in C++ hook is already registered: leave it, untimed.
        return
    torchapi.comm_hooks(model).pop()
    probe.defaults[model] = default


class DefaultHook:
    """The hook behind ddptop's timed default: DDP's all-reduce, until the
    script registers a comm hook of its own after the first forward.

    Under plain DDP a script may register its hook at any step; under ddptop
    the model already has one by then, and DDP's reducer refuses a second.
    So the registered hook stays, and the script's hook and state take this
    one's place behind it (hooks are registered between steps, when no
    bucket is in flight).
    """

    def __init__(self, process_group: Any) -> None:
        self.state: Any = process_group
        self.hook: Any = _allreduce_mean
        self.world = process_group.size()

    def __call__(self, state: object, bucket: Any) -> Any:
        return self.hook(self.state, bucket)


def _allreduce_mean(process_group, bucket):
    """DDP's default arithmetic, bit for bit: scale by 1/world size, then sum.

    DDP's own reducer multiplies each gradient by the reciprocal as it copies
    it into the bucket; torch's Python allreduce_hook divides instead, which
    rounds differently where the world size is not a power of two (at 3
    ranks, 41% of the example's gradients differ in the last bit, and
    the run drifts from the one plain torchrun would train). Multiplying is
    also the cheaper pass. The one case that differs from DDP's is a model
    with gradient_as_bucket_view=True whose gradients are zeroed rather than
    set to None: DDP divides those in place.

    It calls the process group itself: dist.all_reduce's Python checks and
    logging wrappers cost more per bucket than the all-reduce's launch. It
    returns c10d's future as is (its value is a one-tensor list) and leaves
    the unwrapping to _timed's callback, so each bucket costs one callback.
    """
    return allreduce_buffer(process_group, process_group.size(), bucket.buffer())


def allreduce_buffer(process_group: Any, world: int, buffer: torch.Tensor) -> Any:
    """_allreduce_mean on a bucket's buffer, for a group of `world` ranks."""
    if world > 1:  # scaling by one changes no bit, and costs a pass over the bucket
        buffer.mul_(1.0 / world)
    return process_group.allreduce([buffer]).get_future()


def _timed(hook: Any, probe: Probe, reduced: guard.ReducedBuckets) -> Any:
    """A comm hook that times the hook it wraps, checks the rank's own
    gradients before they are mixed with everyone's, and keeps the reduced
    bucket for the guard's norm.

    DDP inspects a hook's signature: the parameter must be named `bucket`,
    and any annotation must be the real GradBucket class, so the wrapper
    carries none (this module's postponed annotations would be strings).

    The hook launches the all-reduce first and does its own work while
    the all-reduce runs: at the end of backward the training thread waits
    for the last bucket's, so what the hook does before the launch, and
    what the all-reduce's callback does on gloo's thread, the step pays in
    full. So the callback does only what must wait for the all-reduce to
    complete (the span's end), and ddptop's own all-reduce, which reduces
    the bucket in place, has its bucket filed for the guard at the launch;
    a script's hook may return another tensor, filed as it completes.
    In the example's step, filing the bucket in the callback cost the
    backward 6 to 8 µs, and the flight-recorder count, phase and callback
    made before the launch about 5 (docs/benchmarks.md).

    The callback is one function, made here, given each bucket's facts as
    arguments (functools.partial), not a closure made per bucket: a closure
    costs cells for what it captures, and it kept the GradBucket alive
    until gloo's thread freed it with the callback. In the example's step
    the closure cost the backward about 2 µs more.
    """

    tracker, count, callbacks = probe.tracker, flightrecorder.COMM_HOOK, probe.callbacks
    journal, clock, timer, keep = tracker.journal.append, commtimer.clock, probe.timer, threadstate.keep
    local = None if reduced.solo else probe.local  # one rank's all-reduce changes nothing to check against
    default = hook if isinstance(hook, DefaultHook) else None
    cuda, put, partial = reduced.cuda, reduced.put, functools.partial
    begin: Callable[[], Any] = timer.begin if cuda else clock

    def completed(buffer, span, fut):
        if cuda:
            timer.end(span, buffer)
        else:  # the span goes to the step in the journal: the sender's thread makes the step's comm of it
            journal((COMM, span, clock(), buffer))
        count.completed += 1
        keep()
        value = fut.value()
        return value[0] if isinstance(value, list) else value

    def completed_by_hook(step, index, buffer, span, fut):
        tensor = completed(buffer, span, fut)
        put(step, index, tensor)
        return tensor

    def timed_hook(state, bucket):
        buffer = bucket.buffer()
        if local is not None:
            local.add(buffer)
        span = begin()
        # ddptop's all-reduce while the script has registered no hook of its own (its state is the group)
        ours = default if default is not None and default.hook is _allreduce_mean else None
        fut = hook(state, bucket) if ours is None else allreduce_buffer(ours.state, ours.world, buffer)
        tracker.phase = "comm"
        count.entered += 1
        count.last = buffer
        if ours is not None:  # it reduces the bucket in place
            put(tracker.step, bucket.index(), buffer)
            callback = partial(completed, buffer, span)
        else:
            callback = partial(completed_by_hook, tracker.step, bucket.index(), buffer, span)
        callbacks.append(weakref.ref(callback))
        return fut.then(callback)

    timed_hook.__name__ = getattr(hook, "__name__", "comm_hook")
    timed_hook.__qualname__ = getattr(hook, "__qualname__", timed_hook.__name__)
    return timed_hook


def _optimizer_begin(probe: Probe, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
    """A training step's optimizer step begins, unless another optimizer's
    step is running: one stepped from inside it (ZeroRedundancyOptimizer's
    local optimizer) is part of that step, which the outer one ends."""
    if probe.stepping is not None and probe.stepping is not optimizer:
        return
    probe.stepping = optimizer
    values = _guard(probe, optimizer)  # first: this step's buckets are filed under the step as it was
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

    What it reads: the all-reduced buckets that hold the optimizer's
    gradients where there are such, as the all-reduce left them: before the
    script's own clipping and unscale_, so their norm over the GradScaler's
    scale is the unscaled pre-clip norm GRAD NORM promises (`shown`). Enforced
    clipping must act on the optimizer's gradients themselves, which the
    script may have clipped already, so then those are `applied` and the
    buckets only shown. Without such buckets (no DDP model owns exactly the
    optimizer's parameters) the optimizer's gradients are both, as a
    GradScaler.step has unscaled them.

    Skipping a non-finite step needs the verdict on the host now, which on
    CUDA waits for the backward pass; when the policy does not skip there,
    the verdict is read a step late instead (policy.GuardPolicy.skips_now).

    One function rather than a chain of them on purpose: it runs once a step
    between torch's kernels, where every function called pays its own cold
    start (docs/benchmarks.md), so the usual step calls only what reads.
    """
    scale, probe.scale = probe.scale, None
    clip = probe.policy.clip_grad
    groups = optimizer.param_groups
    last_optimizer, last_groups, last_count, owner = probe.last_owner
    if last_optimizer() is not optimizer or last_count != len(groups) or last_groups is not groups:
        owner = probe.buckets_of(optimizer)
    shown = owner.latest if owner is not None and owner.step == probe.tracker.step else []
    if owner is not None and shown:
        applied = shown if clip is None else guard.gradients(optimizer)
        shown_scale = None if owner.views else scale  # buckets the gradients are views of were unscaled with them
        solo = owner.solo
    else:
        applied = shown = guard.gradients(optimizer)
        shown_scale, solo = None, False
    local = [] if solo else probe.local.take()  # a one-rank group's hooks add no sums
    if not applied:  # no parameter has a gradient this step: nothing to check or clip
        return {}
    probe.cuda = cuda = applied[0].is_cuda
    if not probe.skips_now[cuda]:
        return guard.verdict_late(guard.Gradients(applied, shown, shown_scale, solo), local, clip)
    if cuda or len(applied) > 1 or shown is not applied or shown_scale is not None:
        norm, shown_norm = guard.norms_now(applied, shown, shown_scale)
    else:  # a small model's one CPU bucket, norm_of's first case without the two calls around it
        norm = shown_norm = float(torch.linalg.vector_norm(applied[0]))
    if not math.isfinite(norm):
        guard.skip(optimizer)
        return {"nonfinite": True, "local_nonfinite": True if solo else guard.any_nonfinite(local), "skipped": "nan"}
    values: dict[str, Any] = {"grad_norm": shown_norm}
    if clip is not None:
        values["clipped"] = guard.clip(applied, norm, clip)
    return values


def _optimizer_end(probe: Probe, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
    if optimizer is not probe.stepping:
        return
    probe.stepping = None
    every = probe.policy.desync_every  # a CPU step between checksums has nothing after it: not even the call, run cold
    values = _after_step(probe) if probe.cuda or (every and probe.tracker.step % every == 0) else {}
    groups = optimizer.param_groups
    if groups and type(lr := groups[0].get("lr")) is float:  # a tensor one (capturable schedules) would need a device read
        values["lr"] = lr
    probe.tracker.optimizer_end(values)


def _after_step(probe: Probe) -> dict[str, Any]:
    """What a step's record gets once it is over, applied or skipped by a scaler:
    on a GPU comm and memory, and on checksum steps the parameters' checksum."""
    values: dict[str, Any] = {}
    if probe.cuda:
        values.update(probe.memory.get())
        comm = probe.timer.take()  # host spans went to the journal as each all-reduce completed
        if comm is not None:
            values["comm_ms"], values["comm_bytes"] = comm
    every = probe.policy.desync_every
    if every and probe.tracker.step % every == 0:
        values["checksum"] = guard.checksum(probe.parameters())
    return values


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
