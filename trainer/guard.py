"""The watchdog's in-rank half: the NaN/Inf guard, enforced clipping, checksums.

Called from the optimizer step pre-hook (optimizer_step.py) on every step:
one fused norm of the gradients, packed with the step's losses into one copy
to the host (late.py), a non-finite step skipped where the policy asks, and
clipping on the device. Why each part is so, and what changes for sharded
gradients: docs/design.md, "the guard".
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ddptop.trainer import held_alike, loss, shard_share, torchapi

CLIP_EPS = 1e-6
"""Added to the norm before dividing, as clip_grad_norm_ does."""

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MOD = 1 << 63
_HALF = 1 << 32


class Slots(NamedTuple):
    """Where each value of a step's pack sits, by name (None: not in this pack)."""

    norms: slice
    script_norm: int | None
    losses: slice
    scale: int | None
    grad_scale: int | None
    found_inf: int | None
    checksum: slice | None


@dataclass(frozen=True, slots=True)
class Layout:
    """What a step's pack holds, in order, and how the host reads it (`fields`).

    Made once per arrangement and kept (optimizer_step._FIELDS), not per step: a step's
    pack has the same layout as the last one's but for a change of model,
    scaler or policy. Its slots are worked out once, as it is made."""

    norms: int
    """Per-gradient norms first (or the one global norm, when the device needed it; none for
    a step whose optimizer never ran)."""
    script_norm: bool
    """Then the norm the script's own clip_grad_norm_ returned this step."""
    script_scaled: bool
    """Whether that norm was of gradients a GradScaler had not unscaled yet."""
    losses: tuple[bool, ...]
    """Then each backward() value, and whether it was scaled by the GradScaler's scale."""
    scale: bool
    """Then the scale a GradScaler multiplied this step's loss by."""
    grad_scale: bool
    """Then the scale a fused optimizer is handed with still-scaled gradients (GradScaler.step)."""
    found_inf: bool
    """Then a GradScaler's found_inf for a fused optimizer: 1 means the scaler skips the step."""
    checksum: bool
    """Last, the checksum's high and low 32 bits."""
    clip: float | None
    solo: bool
    """A one-rank group: a non-finite gradient is this rank's own."""
    skipped_on_device: bool = False
    """ddptop handed the optimizer a found_inf of its own: a non-finite step was skipped."""
    local_norms: bool = False
    """The norms are of this rank's shards of sharded gradients (sharded_norms): they tell
    whether the step is finite, and the rank's share of the grad norm's square, not the norm."""
    shard_weights: shard_share.Weights | None = None
    """With local_norms, each norm's weight in that share (shard_share.py); None: no share."""
    sharded: bool = False
    """The gradients are sharded over ranks: every step says so (the supervisor words its verdicts
    by it); a non-finite one is skipped only off a global norm (optimizer_step._guard)."""
    loss_divisor: int = 1
    """What the losses' sum is divided by: a pipeline schedule's micro-batches (pipelining.py)."""

    slots: Slots = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        at = 0

        def take(count: int) -> slice:
            nonlocal at
            at += count
            return slice(at - count, at)

        def one(present: bool) -> int | None:
            return take(1).start if present else None

        norms = take(self.norms)
        script_norm = one(self.script_norm)
        losses = take(len(self.losses))
        scale, grad_scale, found_inf = one(self.scale), one(self.grad_scale), one(self.found_inf)
        checksum = take(2) if self.checksum else None
        object.__setattr__(self, "slots", Slots(norms, script_norm, losses, scale, grad_scale, found_inf, checksum))

    def fields(self, values: list[float]) -> dict[str, Any]:
        """The step record's values, read off the pack on the host: on the sender's thread,
        or on the training thread for a non-finite step that may be skipped there."""
        slots = self.slots
        norms = values[slots.norms]
        norm = math.sqrt(math.fsum(map(operator.mul, norms, norms))) if len(norms) > 1 else abs(norms[0]) if norms else None
        script = None if slots.script_norm is None else values[slots.script_norm]
        losses = values[slots.losses]
        scale = 1.0 if slots.scale is None else values[slots.scale]
        grad_scale = 1.0 if slots.grad_scale is None else values[slots.grad_scale]
        out: dict[str, Any] = {"sharded": True} if self.sharded else {}
        if slots.found_inf is not None and values[slots.found_inf] == 1.0:
            out["skipped"] = "scaler"
        if slots.checksum is not None:
            high, low = values[slots.checksum]
            out["checksum"] = (int(high) * _HALF + int(low)) % _MOD
        if self.losses:
            out["loss"] = loss.packed(losses, self.losses, scale, self.loss_divisor)
        if "skipped" in out or norm is None:  # a step a scaler skipped, or one with no gradients: its losses
            return out
        if not math.isfinite(norm):
            bad_loss = not all(map(math.isfinite, losses))
            out["nonfinite"] = True
            out["local_nonfinite"] = True if self.solo or bad_loss else (False if losses else None)
            if self.skipped_on_device:
                out["skipped"] = "nan"
            return out
        unscaled = norm / grad_scale
        if script is not None:
            out["grad_norm"] = script / scale if self.script_scaled else script
        elif not self.local_norms:
            out["grad_norm"] = unscaled
        elif self.shard_weights is not None:
            out["shard_norm"] = unscaled
            out["grad_sq_share"] = shard_share.share(norms, self.shard_weights, grad_scale)
        if self.clip is not None:
            out["clipped"] = unscaled > self.clip
        return out


def norms(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each gradient's L2 norm, unread, in one fused kernel per device and dtype. fp16
    gradients' norms are taken in fp32: a large fp16 tensor's norm overflows to inf (a
    torch whose _foreach_norm takes no dtype, before 2.4, takes them one by one). A sparse
    gradient (nn.Embedding(sparse=True)), which _foreach_norm refuses, has them taken one
    by one too: found by that refusal, so a dense step pays no look at its layouts.

    A single tensor (a model's gradients in one of DDP's buckets, Flat) is normed alone:
    one reduction kernel, where on a GPU torch's fused norm launches four (two fills of its
    scratch, its kernel, its cleanup) and allocates its results one by one."""
    if len(grads) == 1:
        return [_norm(grads[0])]
    try:
        if grads[0].dtype is not torch.float16:
            return list(torchapi.foreach_norm(grads))
        if torchapi.FOREACH_NORM_DTYPE:
            return list(torchapi.foreach_norm(grads, 2, dtype=torch.float32))
    except (NotImplementedError, RuntimeError):  # RuntimeError: how an older torch refuses a sparse tensor
        pass
    return [_norm(grad) for grad in grads]


class Flat(NamedTuple):
    """Gradients that lie whole in a few flat buffers, and those buffers: DDP's buckets when
    the script builds it with gradient_as_bucket_view=True, where each gradient is a view of
    its bucket. The norm of a buffer is the norm of the gradients it holds, so the guard norms
    and clips a bucket at a time: on a GPU torch's fused norm does host work for each tensor
    it is given (docs/benchmarks.md), so the step pays for a few buckets rather than every
    gradient, and on the CPU, where the fused norm is a loop, a few norms rather than one a
    gradient.

    Found once (flat_buffers) and kept while every gradient is where it was found (`at`, each
    one's address): the buffers are held, so no other tensor can take their memory, and a
    gradient at a kept address is the same part of the same buffer. A gradient that moved (DDP
    rebuilds its buckets after the first step) has them found again, `moves` times at most
    (MOVES_KEPT), past which the gradients are normed one by one. A step that takes the
    script's own norm needs none: they are let go then, since a kept bucket DDP has since
    replaced would hold a model's gradients' worth of memory for nothing."""

    at: list[int]
    buffers: list[torch.Tensor]
    moves: int = 0


MOVES_KEPT = 3
"""How often an optimizer's flat buffers are found again before the guard stops looking: a
layout that moves every step (buffers made afresh each step) would cost a look at every
gradient each step, more than the fused norm it spares."""


def flat_buffers(grads: list[torch.Tensor], moves: int = 0) -> Flat | None:
    """The flat buffers that grads tile exactly, each gradient a dense slice of one and every
    element of each one some gradient's; None where they do not, or where there are as many
    buffers as gradients (each its own: nothing spared). Exact or nothing: a buffer with room
    for anything else (a gradient another optimizer steps, a gap, an overlap) would change the
    norm, so it is not used. Python for each gradient: called when the optimizer's gradients
    are first seen and when they move, never on a step where they stay."""
    found: dict[int, tuple[Any, torch.Tensor, list[tuple[Any, int]]]] = {}
    for grad in grads:
        if type(grad) is not torch.Tensor or grad.layout is not torch.strided or not grad.is_contiguous():
            return None
        storage = grad.untyped_storage()
        entry = found.setdefault(storage.data_ptr(), (storage, grad, []))
        if entry[1].dtype is not grad.dtype:
            return None
        entry[2].append((grad.storage_offset(), grad.numel()))
    if len(found) >= len(grads):
        return None
    buffers = []
    for storage, first, spans in found.values():
        end = 0
        for offset, numel in sorted(spans):
            if offset != end:
                return None
            end += numel
        if end * first.element_size() != storage.nbytes():
            return None
        buffers.append(torch.empty(0, dtype=first.dtype, device=first.device).set_(storage))
    return Flat([grad.data_ptr() for grad in grads], buffers, moves)


def _norm(grad: torch.Tensor) -> torch.Tensor:
    """One gradient's L2 norm, unread, in fp32 for fp16. Of a sparse one, the norm of its values:
    coalesced first on the CPU (a row given twice adds up first); on a GPU, where coalescing
    would wait for the device, of its values as they are, exact once coalesced (DDP's all-reduce
    of a sparse gradient coalesces it), and non-finite exactly when the coalesced one is."""
    dtype = torch.float32 if grad.dtype is torch.float16 else None
    if grad.layout is not torch.strided:
        grad = grad.coalesce().values() if grad.device.type == "cpu" else torchapi.sparse_values(grad)
    return torch.linalg.vector_norm(grad, dtype=dtype)


def total(per_tensor: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of per-tensor norms, on the device, unread (as clip_grad_norm_ takes it).
    Norms on several devices (a model split over GPUs) are taken on the first one's, as
    clip_grad_norm_ takes them: pack moves them there only once stack has refused them, so a
    model on one device pays no look at its devices."""
    if len(per_tensor) == 1:
        return per_tensor[0]
    return torch.linalg.vector_norm(pack(per_tensor))


def clip_on_device(grads: list[torch.Tensor], norm: torch.Tensor, max_norm: float, several_devices: bool = False) -> None:
    """Scale grads by min(1, max_norm / (norm + eps)) on the device, as clip_grad_norm_ does.
    Gradients on several devices (on_several_devices) are scaled on each by the factor moved
    there, as clip_grad_norm_ does: one fused product would refuse them halfway, some scaled."""
    factor = torch.clamp(max_norm / (norm + CLIP_EPS), max=1.0)
    if not several_devices:
        torchapi.foreach_mul_(grads, factor)
        return
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for grad in grads:
        by_device.setdefault(grad.device, []).append(grad)
    for device, group in by_device.items():
        torchapi.foreach_mul_(group, factor.to(device))


def on_several_devices(grads: list[torch.Tensor]) -> bool:
    """Whether grads are on more than one device (a model split over GPUs in one rank, which DDP
    takes): asked once for each optimizer and count of gradients (Probe.gradients)."""
    return len({grad.device for grad in grads}) > 1


def dtensors(grads: list[torch.Tensor]) -> tuple[bool, ...]:
    """Which of grads are DTensors, in order: asked once for each optimizer and count of
    gradients (Probe.gradients), so that a step of sharded gradients tells them apart with no call."""
    return tuple(map(torchapi.is_dtensor, grads))


_LOCAL = operator.attrgetter("_local_tensor")
"""A DTensor's local shard as a plain tensor, read with no call: to_local() is an autograd
function, a Python call and a view op for each gradient each step, where a gradient needs no graph."""


def sharded_norms(
    grads: list[Any], clip: float | None, grad_scale: torch.Tensor | None, split: tuple[bool, ...], own: tuple[bool, ...] = ()
) -> tuple[list[torch.Tensor], bool]:
    """The norms a step of sharded gradients packs (DTensors: FSDP2's fully_shard, tensor
    parallelism; some may be plain, of parameters left unsharded), and whether they are of this
    rank's shards alone.

    Without a clip to enforce, the norm of each gradient's local shard: enough for the
    verdict (a non-finite shard makes its gradient non-finite), but not the grad norm, which
    needs every rank's shards, a collective ddptop does not add for a figure (the script's
    own clip_grad_norm_ gives it, hooks.py). With --clip-grad the global norm is what clipping
    needs: taken as clip_grad_norm_ takes it on DTensors, the shards' norms reduced over the
    ranks that hold them (the only collective ddptop issues, and asked for by that option),
    with a plain gradient's norm as this rank holds it whole; then each rank's shards are
    clipped with it on the device. Gradients on different meshes (a layer tensor parallelism
    splits, beside one FSDP shards alone) are reduced mesh by mesh: DTensors of two meshes
    cannot be stacked, and torch's own clip_grad_norm_ raises on them. A plain gradient that is
    the rank's own (of a parameter fully_shard ignored: an expert of its own) is a piece of the
    whole that no other rank holds: their squared norms are summed over the ranks, so that every
    rank clips by the same norm. split: which of grads are DTensors (dtensors()); own: which
    are the rank's own (Probe.rank_own; none where empty)."""
    local = list(map(_LOCAL, grads)) if False not in split else [_LOCAL(g) if d else g for g, d in zip(grads, split)]
    if clip is None:
        return norms(local), True
    meshes: dict[Any, list[Any]] = {}
    for grad, dtensor in zip(grads, split):
        if dtensor:
            meshes.setdefault(grad.device_mesh, []).append(grad)
    parts = [torchapi.replicated(total(norms(on_mesh))).to_local() for on_mesh in meshes.values()]
    if not all(split):
        plain = [(grad, at < len(own) and own[at]) for at, (grad, dtensor) in enumerate(zip(grads, split)) if not dtensor]
        if held := [grad for grad, is_own in plain if not is_own]:
            parts.append(total(norms(held)))
        if mine := [grad for grad, is_own in plain if is_own]:
            parts.append(_over_ranks(total(norms(mine))))
    whole = total(parts)
    clip_on_device(local, whole if grad_scale is None else whole / grad_scale, clip)
    return [whole], False


def _over_ranks(norm: torch.Tensor) -> torch.Tensor:
    """The norm of every rank's pieces, from this rank's norm of its own: their squares summed
    over the job, in one all-reduce of a scalar."""
    square = norm.float().square()
    torch.distributed.all_reduce(square)
    return square.sqrt()


def found_inf(norm: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """1.0 where norm is not finite, else 0.0: what a fused optimizer takes to skip a step.
    Written into out, a float32 scalar on norm's device made once: no new tensor, and no
    .float() op, a step.

    Two kernels: norm - norm is 0 for a finite norm and NaN for an infinite or NaN one, and
    NaN != 0. torch.isfinite would be four (eq, abs, ne, mul) and its negation a fifth; on a
    GPU host each is a launch of tens of microseconds on the training thread."""
    return torch.ne(torch.sub(norm, norm), 0, out=out)


def checksum_parts(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters' checksum (checksum()) as two float64 tensors, its high and low 32 bits,
    exact in a float pack, unread; none when no tensor is one that ranks hold equal.

    Two ops a tensor, its integer view and the view's sum, and no detach: an integer tensor
    takes no part in autograd, so the view of a parameter records nothing. Each view is summed
    in its own width (_bit_sum says why). The sums are stacked as the step's pack is: moved to the
    first one's device only when they are apart (a model split over GPUs).

    tensors: plain ones, which ranks should hold equal: what held_alike.pieces picks of the
    parameters (plain ones, DTensors' local pieces other ranks hold alike)."""
    sums = list(map(_bit_sum, tensors))
    if not sums:
        return []
    stacked = pack(sums)
    weights = torch.arange(1, len(sums) + 1, device=stacked.device, dtype=torch.int64)
    summed = (stacked * weights).sum()
    return [torch.bitwise_right_shift(summed, 32).double(), torch.bitwise_and(summed, _HALF - 1).double()]


def _bit_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of tensor's bits viewed as integers: 32 bits wide where its shape allows (16-bit
    floats in pairs), else as wide as its elements.

    The view is summed in its own dtype, wrapping around: still exact, since integer sums
    modulo 2**bits do not depend on their order. A sum into int64 would first copy the whole
    tensor to int64, up to four times its size, which a GPU's allocator then keeps reserved. A
    half-precision tensor is summed in pairs of elements because a 16-bit sum would miss one
    change of many elements in 2**16, a 32-bit one one in 2**32."""
    size = tensor.element_size()
    paired = size < 4 and tensor.dim() > 0 and tensor.shape[-1] % (4 // size) == 0
    try:
        bits = tensor.view(torch.int32 if paired else _INT_VIEW[size])
    except RuntimeError:  # strides or an offset that the paired view cannot cover
        bits = tensor.view(_INT_VIEW[size])
    return bits.sum(dtype=bits.dtype)  # without dtype, an integer sum would go to int64 by a copy


def checksum(tensors: Iterable[torch.Tensor]) -> int | None:
    """An exact fingerprint of tensors' bits, equal on ranks whose tensors are, read now: of
    the ones ranks hold alike (held_alike.pieces: plain ones, DTensors' local pieces).

    Each tensor's bits are summed as integers of their view's width (_bit_sum; exact, so the
    order of the reduction cannot matter), and the sums weighted by position, so two
    swapped tensors do not cancel out. A two's complement sum split into
    high (signed) and low 32 bits gives back the same number mod 2^63.
    """
    parts = checksum_parts(held_alike.pieces(list(tensors))[0])
    if not parts:
        return None
    high, low = (float(part) for part in parts)
    return (int(high) * _HALF + int(low)) % _MOD


def pack(parts: list[torch.Tensor]) -> torch.Tensor:
    """The step's values in one tensor, on the first part's device (a part elsewhere is moved).
    Under no grad mode: the losses among them still have their graphs."""
    try:
        return torch.stack(parts)
    except RuntimeError:  # parts on two devices (a model split over GPUs), or of shapes (1,) and ()
        device = parts[0].device
        return torch.stack([p.detach().to(device).reshape(()) for p in parts])


def skip(optimizer: Any) -> None:
    """Make optimizer.step() a no-op for this step: no weight or state changes."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None
