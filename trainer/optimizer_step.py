"""What happens at each optimizer step of a rank: the guard before it, the step's end after.

hooks.install registers `begin` and `end` as torch's global optimizer
step pre- and post-hooks. Before the optimizer sees the gradients, `begin`
runs the in-rank watchdog (guard.py): one fused norm of the gradients (of
DDP's buckets, where the gradients are views of them; or the script's own
clip_grad_norm_'s, where it measured all of them), packed
with the step's losses and scales into one tensor, one copy to the host;
the NaN/Inf skip where the policy asks; clipping on the device; every few
steps a checksum. After it, `end` closes the step's record, reads DDP's
sampled timings when they are due, and gives a profiler capture its step
boundary.

This module imports torch at the top: it is only reached from hooks.py,
once the script's own `import torch` has finished (runtime.py).
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Any

import torch

from ddptop.trainer import guard, held_alike, late, loss, shard_share, torchapi
from ddptop.trainer.probe import Gradients, Probe


def begin(probe: Probe, optimizer: Any, args: Any = None, kwargs: Any = None) -> tuple[Any, Any] | None:
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

    One fused norm per gradient (per bucket, guard.Flat), packed with the step's losses and scales
    into one tensor, one copy to the host (guard.py says what is in it). The
    verdict is read now where the step may have to be skipped on the host
    (the CPU, where reading waits for nothing; `--on-nan skip` on a GPU with
    an optimizer that takes no found_inf); a fused optimizer on a GPU is
    handed the verdict as its found_inf, on the device; otherwise the
    values are read a step late. Either way they are decoded into the
    record's fields on the sender's thread (late.Read, late.RingRead),
    except a non-finite step's that the training thread may skip.

    One function rather than a chain of them on purpose: it runs once a step
    between torch's kernels, where every function called pays its own cold
    start, so the usual step calls only torch.
    """
    tracker, policy = probe.tracker, probe.policy
    scale, probe.scaler.scale = probe.scaler.scale, None
    script, clipped = probe.clip.script_norm, probe.clip.clipped
    if probe.clip.clips:  # the script's clip is this step's alone, and its parameters are not held past it
        probe.clip.script_norm, probe.clip.clips, probe.clip.clipped = None, 0, []
    # Each p.grad is a call into torch: read once, not once to test and again to take.
    grads = [grad for group in optimizer.param_groups for p in group["params"] if (grad := p.grad) is not None]
    if not grads:  # no parameter has a gradient this step: nothing to check or clip, only its losses
        probe.scaler.scale = scale
        return losses_only(probe)
    losses, tracker.losses = tracker.losses, []
    first = grads[0]
    look = (id(optimizer), len(grads))
    known = probe.gradients.get(look)
    if known is None:  # the usual step: no call
        if len(probe.gradients) >= COVERS_KEPT:  # a script that makes optimizer after optimizer, or steps ever new sets
            probe.gradients.clear()
        roots = probe.fsdp1_roots(optimizer) if probe.fsdp1 else ()
        # FSDP2 may leave some of a model's parameters plain (an unsharded root): any DTensor makes the step sharded.
        split = guard.dtensors(grads)
        sharded = bool(roots) or True in split
        own = probe.rank_own(optimizer) if probe.ignored else ()
        known = probe.gradients[look] = Gradients(
            sharded,
            guard.on_several_devices(grads),
            None if sharded else _flat(probe, optimizer, grads),
            roots,
            split,
            shard_share.weights(grads, probe.world, own) if True in split and not roots else None,
            own,
        )
    sharded = known.sharded
    probe.cuda = cuda = first.is_cuda
    if sharded and "sharded" not in probe.noticed:
        probe.tell_once("sharded", SHARDED_NOTICE)
        probe.sampled.time_sharded()
    if cuda and probe.sampled.device is None:
        probe.sampled.device = first.device.index
    grad_scale = getattr(optimizer, "grad_scale", None)  # a fused optimizer under GradScaler.step: still scaled
    scaler_inf = getattr(optimizer, "found_inf", None)
    clip = policy.clip_grad
    # The script's own norm of unscaled gradients is the step's, where it measured all of them
    # (an fp16 norm is not: it overflows where the gradients do not).
    borrowed: torch.Tensor | None = None
    if script is not None and clip is None and grad_scale is None and not script[1] and clipped and script[0].dtype is not torch.float16:
        key = (id(optimizer), len(grads), len(clipped), id(clipped[0]), id(clipped[-1]))
        covers = probe.clip.covers.get(key)
        if covers is None:
            covers = _script_covers(probe, optimizer, clipped, key)
        if covers:
            borrowed, script = script[0], None
    # A sharded step is skipped only where every rank reads the same verdict at no cost of ddptop's:
    # off a global norm, which the script's clip or --clip-grad's reduced over the ranks already.
    skips = probe.skips and (not sharded or borrowed is not None or clip is not None)
    on_device = cuda and skips and scaler_inf is None and getattr(optimizer, "_step_supports_amp_scaling", False)
    local = False
    if borrowed is not None:
        parts = [borrowed]
        if known.flat is not None:  # a script that clips needs no buffers: let go of them, and of looking
            probe.gradients[look] = known._replace(flat=None)
    elif sharded and known.roots and clip is not None:  # FSDP1's flat shards: their roots' own clip takes the global norm
        whole = guard.total([probe.fsdp1_norm(root) for ref in known.roots if (root := ref()) is not None])
        guard.clip_on_device(grads, whole if grad_scale is None else whole / grad_scale, clip)
        parts = [whole]
    elif sharded:
        parts, local = guard.sharded_norms(grads, clip, grad_scale, known.dtensors, known.own)
    else:
        flat = known.flat
        if flat is not None and list(map(_ADDRESS, grads)) != flat.at:  # the usual step: no call
            flat = _moved(probe, optimizer, grads, look, known)
        normed = grads if flat is None else flat.buffers
        parts = guard.norms(normed)
        if clip is not None or on_device:
            parts = [guard.total(parts)]
            if clip is not None:
                guard.clip_on_device(normed, parts[0] if grad_scale is None else parts[0] / grad_scale, clip, known.several_devices)
    if on_device:  # the flag on the norm's device, which a script's clip of a model over GPUs picks (its first gradient's)
        flag, norm = probe.fused.inf_flag, parts[0]
        if flag is None or flag.device != norm.device:
            flag = probe.fused.inf_flag = torch.empty((), dtype=torch.float32, device=norm.device)
        optimizer.found_inf = guard.found_inf(norm, flag)
        probe.fused.found_inf_set = optimizer
    norms = len(parts)
    if script is not None:
        parts.append(script[0])
    marks = loss.scaled_marks(probe, len(losses)) if probe.scaler.scaled_at else (False,) * len(losses)  # the usual step: no call
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
    replicas = tracker.replicas
    if checksum:
        compared = probe.comparable(probe.parameters() or [p for g in optimizer.param_groups for p in g["params"]])
        compared, holders = held_alike.pieces(compared)
        if holders is not None:  # HSDP's shards, held alike across its replicas: compared with those ranks
            replicas = holders
        summed = guard.checksum_parts(compared)
        checksum = bool(summed)  # none where every parameter is sharded (FSDP's): no rank holds another's
        parts += summed
    divisor = probe.pipeline.loss_divisor
    if divisor != 1:  # a pipeline schedule's step: taken for this step alone
        probe.pipeline.loss_divisor = 1
    # What decides the pack's layout, as a key: a tuple costs the step no call; on a new one the
    # Layout is made by name, once.
    layout_key = (norms, script is not None, bool(script and script[1]), marks, has_scale, grad_scale is not None,
           scaler_inf is not None, checksum, clip, probe.world == 1, on_device, local, sharded, divisor, known.weights)  # fmt: skip
    fields = _FIELDS.get(layout_key)
    if fields is None:
        fields = _FIELDS[layout_key] = guard.Layout(
            norms=norms,
            script_norm=script is not None,
            script_scaled=bool(script and script[1]),
            losses=marks,
            scale=has_scale,
            grad_scale=grad_scale is not None,
            found_inf=scaler_inf is not None,
            checksum=checksum,
            clip=clip,
            solo=probe.world == 1,
            skipped_on_device=on_device,
            local_norms=local,
            shard_weights=known.weights if local else None,
            sharded=sharded,
            loss_divisor=divisor,
        ).fields
    grad_mode = torch.is_grad_enabled()
    if grad_mode:  # the losses still have their graphs: the pack needs none
        torchapi.set_grad_enabled(False)
    packed = guard.pack(parts)
    if grad_mode:
        torchapi.set_grad_enabled(True)
    values: dict[str, Any]
    if not cuda or (probe.waits_on_gpu and skips and not on_device and scaler_inf is None):
        read = packed.tolist()
        # The verdict needs only the norms: the global norm is finite when each one is. The
        # rest is decoded on the sender's thread, unless a non-finite step may be skipped.
        if not skips or all(map(math.isfinite, read[:norms])):
            values = {late.FIELDS: late.Read((read, fields))}
        else:
            values = fields(read)
            if values.get("nonfinite"):
                guard.skip(optimizer)
                values["skipped"] = "nan"
    else:
        if policy.on_nan == "auto" and skips and not on_device and scaler_inf is None and "late" not in probe.noticed:  # no call once told
            probe.tell_once("late", NAN_APPLIED_NOTICE.format(name=type(optimizer).__name__))
        values = {late.FIELDS: late.RING.send(packed, fields)}
    if checksum and replicas is not None:  # the ranks this checksum is compared with
        values["replicas"] = list(replicas)
    return values


_FIELDS: dict[tuple[Any, ...], Any] = {}
"""Each layout's fields, by what decides it, looked up without a call: the usual step has the last one's."""


SHARDED_NOTICE = (
    "the gradients are sharded over ranks (FSDP's FullyShardedDataParallel or fully_shard, or tensor parallelism): a non-finite "
    "step is skipped as --on-nan says only where the script's clip_grad_norm_ (or --clip-grad) took the global norm, which every "
    "rank reads alike; otherwise it is reported but not skipped, since a rank cannot tell the others without a collective, and "
    "ranks that skipped alone would hold shards a step apart; the grad norm shown is the script's clip_grad_norm_'s "
    "(or --clip-grad's), else ddptop adds up every rank's shards of it; the desync checksum compares only what ranks hold alike "
    "(HSDP's shards across its replicas, parameters left whole)"
)


NAN_APPLIED_NOTICE = (
    "{name} on a GPU takes no found_inf tensor, so a non-finite step is seen a step late and "
    "reaches the weights; --on-nan skip skips it exactly, at a wait for the backward pass every step"
)


_ADDRESS = torch.Tensor.data_ptr


def _flat(probe: Probe, optimizer: Any, grads: list[torch.Tensor], moves: int = 0) -> guard.Flat | None:
    """The flat buffers the optimizer's gradients lie in (guard.Flat), where they lie in a few
    (asked only of gradients that are no ranks' shards). The buffers are held by
    Probe.gradients, which lets go of them when the optimizer goes: they are DDP's buckets,
    which a script that builds model after model would otherwise keep, a model's gradients
    each."""
    flat = guard.flat_buffers(grads, moves)
    key = id(optimizer)
    if flat is not None and key not in probe.watched:  # once an optimizer: its count of gradients may come and go
        try:
            weakref.finalize(optimizer, _let_go, probe, key).atexit = False
        except TypeError:  # an optimizer that takes no weak reference: its gradients are normed one by one
            return None
        probe.watched.add(key)
    return flat


def _let_go(probe: Probe, key: int) -> None:
    """An optimizer is gone: its entries, and the buckets they held, go with it. Its keys are
    copied first in one call (list), since a collection on another thread may run this while the
    training thread adds an entry."""
    for look in list(probe.gradients):
        if look[0] == key:
            probe.gradients.pop(look, None)
    probe.watched.discard(key)


def _moved(probe: Probe, optimizer: Any, grads: list[torch.Tensor], look: tuple[int, int], known: Gradients) -> guard.Flat | None:
    """A step whose gradients are not where its optimizer's flat buffers were found (DDP
    rebuilt its buckets after the first step, or a script set its own gradients): found
    again, up to guard.MOVES_KEPT times."""
    assert known.flat is not None
    moves = known.flat.moves + 1
    flat = _flat(probe, optimizer, grads, moves) if moves <= guard.MOVES_KEPT else None
    probe.gradients[look] = known._replace(flat=flat)
    return flat


COVERS_KEPT = 16
"""Arrangements ScriptClip.covers, and (optimizer, count of gradients) entries Probe.gradients, keep at most: cleared when full."""


def _script_covers(probe: Probe, optimizer: Any, clipped: list[Any], key: tuple[int, ...]) -> bool:
    """Whether the parameters the script's clip_grad_norm_ was given hold every gradient the
    optimizer steps: then its norm is the guard's (a clip of some of them leaves the rest
    unmeasured). Found once for each arrangement (key: ScriptClip.covers) and kept."""
    given = {id(param) for param in clipped}
    covers = all(id(param) in given for group in optimizer.param_groups for param in group["params"] if param.grad is not None)
    if len(probe.clip.covers) >= COVERS_KEPT:
        probe.clip.covers.clear()
    probe.clip.covers[key] = covers
    return covers


def losses_only(probe: Probe) -> dict[str, Any]:
    """The values of a step with no gradients (a GradScaler skipped its optimizer): the losses, unscaled."""
    tracker = probe.tracker
    losses, tracker.losses = tracker.losses, []
    scale, probe.scaler.scale = probe.scaler.scale, None
    divisor, probe.pipeline.loss_divisor = probe.pipeline.loss_divisor, 1
    probe.clip.script_norm, probe.clip.clips, probe.clip.clipped = None, 0, []
    marks = loss.scaled_marks(probe, len(losses))
    if not losses:
        return {}
    parts = [loss.detach() for loss in losses]
    has_scale = scale is not None and True in marks
    if has_scale:
        parts.append(scale)
    fields = guard.Layout(
        norms=0,
        script_norm=False,
        script_scaled=False,
        losses=marks,
        scale=has_scale,
        grad_scale=False,
        found_inf=False,
        checksum=False,
        clip=None,
        solo=probe.world == 1,
        loss_divisor=divisor,
    ).fields
    packed = guard.pack(parts)
    return {late.FIELDS: late.RING.send(packed, fields)} if packed.is_cuda else fields(packed.tolist())


def end(probe: Probe, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
    if optimizer is not probe.stepping:
        return
    probe.stepping = None
    if probe.fused.found_inf_set is optimizer:
        del optimizer.found_inf
        probe.fused.found_inf_set = None
    # Once a second: the reducer is idle between steps; a sharded step timed ends here (sampled.py).
    timed = probe.sampled.read_comm(probe.tracker.step) if probe.sampled.comm_due else None
    if probe.models:  # a DDP model's step: look for an evaluation that passes by DDP (BetweenSteps.arm, with no call)
        between = probe.between
        between.hooks[between.key] = between.first
    groups = optimizer.param_groups
    values = {"lr": lr} if groups and type(lr := groups[0].get("lr")) is float else {}  # a tensor lr would need a device read
    if timed:
        values.update(timed)
    probe.tracker.optimizer_end(values)
    if probe.captures.active:  # a capture asked for or running (profiling.py): a step boundary for it
        tracker = probe.tracker
        probe.captures.boundary(tracker.step, tracker.began_wall(), tracker.micro)
