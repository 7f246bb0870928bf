"""The watchdog's in-rank half: the NaN/Inf guard, enforced clipping, checksums.

Called from the optimizer step hooks (hooks.py), so the script needs no
change. Before the optimizer applies a step:

- the global gradient norm is taken, every step: it is the pre-clip norm
  the dashboard shows, the NaN/Inf test, and the clipping factor in one pass.
  Where DDP's all-reduced buckets hold exactly the optimizer's gradients
  (ReducedBuckets), it is taken over the buckets, a few flat tensors. They
  are also the gradients as the all-reduce left them, before anything the
  script did to them after backward: its own clip_grad_norm_, a GradScaler's
  unscale_. So the norm shown is theirs, divided by the scale a GradScaler
  multiplied the loss by (Gradients): the unscaled pre-clip norm, whatever
  the script clips, scales or forgets to unscale.
  After DDP's all-reduce every rank holds the same gradients, so a
  non-finite value on any rank is non-finite on all of them: every rank
  reaches the same verdict at the same step with no collective of its own;
- a non-finite step is skipped, where the policy asks (see below), by
  setting the gradients to None, which every torch optimizer treats as
  "leave this parameter and its state be";
- with a clip norm set, gradients over it are scaled down as
  torch.nn.utils.clip_grad_norm_ does. Gradients the script already
  clipped to that norm are under it, and are left bitwise alone.

Only the pre-all-reduce bucket sums (LocalCheck) say which rank's own
gradients were bad. Every `desync_every` steps a checksum of the parameters
goes with the step record; the supervisor compares ranks.

Skipping needs the verdict on the host before the optimizer runs, which on
CUDA means waiting for the backward pass: the CPU can no longer run ahead
(into the next batch's loading) while the GPU works, 31% of the example
job's step on an H100 at width 8192 (README, Benchmarks). So on CUDA ranks
the default policy does not skip: the verdict, the norm and clipping stay
on the device and are read a step late (verdict_late); `--on-nan skip` asks
for the skip and its synchronisation.
Bucket sums and checksums stay on the device until read late.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch

from ddptop.trainer import late, torchapi

CLIP_EPS = 1e-6
"""Added to the norm before dividing, as clip_grad_norm_ does."""

LOCAL_SUMS_MAX = 4096
"""Bucket sums kept between two optimizer steps; a script that never steps a
torch optimizer must not grow them without bound."""

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MOD = 1 << 63


class LocalCheck:
    """This rank's gradient buckets as they were before the all-reduce.

    A sum is non-finite exactly when some element is (inf - inf is nan), and
    one sum per bucket is the cheapest pass there is. On CUDA the sums are
    queued kernels, read only when the guard trips.
    """

    def __init__(self) -> None:
        self._sums: deque[Any] = deque(maxlen=LOCAL_SUMS_MAX)

    def add(self, buffer: torch.Tensor) -> None:
        self._sums.append(torch.sum(buffer, dtype=torch.float32))

    def take(self) -> list[Any]:
        """This step's sums; the next step starts empty."""
        if not self._sums:
            return []
        sums = list(self._sums)
        self._sums.clear()
        return sums


class ReducedBuckets:
    """One DDP model's gradient buckets as its latest all-reduce left them.

    DDP copies each all-reduced bucket into its parameters' .grad, so when an
    optimizer owns exactly the model's trainable parameters, the buckets'
    norm is the gradients' norm, taken over a few flat tensors instead of one
    per parameter: on the example model (one bucket, six parameters) that
    takes about 40% off the guard's cost. Buckets are kept per step: a bucket reduced
    again in the same step (another backward without no_sync) is the same
    tensor with the latest values, and a step without an all-reduce (under
    no_sync) has none.

    A step's buckets are held until the next step's first all-reduce: they
    are DDP's own tensors, so holding them costs no memory.

    With gradient_as_bucket_view=True the gradients are views of the buckets
    (`views`): whatever the script does to its gradients after backward
    (unscale_, its own clipping) it does to the buckets too.
    """

    def __init__(self, params: Iterable[torch.Tensor], views: bool = False, solo: bool = False, cuda: bool = False) -> None:
        self.params = frozenset(id(p) for p in params)
        self.views = views
        self.solo = solo
        """A one-rank group: the rank's own buckets need no LocalCheck (Gradients.solo)."""
        self.cuda = cuda
        """Whether the model, and so each of its buckets, is on a GPU: its comm is timed with CUDA events."""
        self.step: int | None = None
        """The step whose all-reduces filled `latest`."""
        self.latest: list[torch.Tensor] = []
        """That step's buckets when all are dense, for the guard (an attribute the hook reads, not a call)."""
        self._by_index: dict[int, torch.Tensor] = {}
        self._dense = True

    def put(self, step: int, index: int, tensor: torch.Tensor) -> None:
        """A bucket of `step` reduced: launched, for an all-reduce in place (on the training
        thread), or completed, for a script's hook (on gloo's thread, or CUDA's launching one);
        the guard reads it once backward, which waits for every bucket, is over."""
        if step != self.step:
            self._by_index = {}
            self.step = step
        self._by_index[index] = tensor
        if tensor.layout != torch.strided:  # a model's buckets keep their layout
            self._dense = False
        self.latest = list(self._by_index.values()) if self._dense else []

    def held(self) -> list[torch.Tensor]:
        """The latest step's buckets, whatever their layout."""
        return list(self._by_index.values())


class Gradients(NamedTuple):
    """What the guard reads at a step: `applied`, the tensors whose norm is the
    NaN/Inf test and the clipping factor (the optimizer's gradients, or the
    buckets that equal them); and `shown`, whose norm divided by `scale` is the
    pre-clip norm the dashboard shows. They are one list unless clipping is
    enforced: then the optimizer's gradients, which the script may have
    clipped already, are clipped, and the buckets say what came before.

    A NamedTuple rather than a frozen dataclass: one is built every step, and
    a frozen dataclass's __init__ costs several times a tuple's."""

    applied: list[torch.Tensor]
    shown: list[torch.Tensor]
    scale: torch.Tensor | None = None
    """What a GradScaler multiplied the loss by, when `shown` holds gradients of the scaled loss."""
    solo: bool = False
    """Whether the buckets came from a one-rank group: the all-reduce changed
    nothing, so the rank's own gradients are the reduced ones and a non-finite
    verdict is this rank's own without a LocalCheck."""

    @classmethod
    def of(cls, grads: list[torch.Tensor]) -> Gradients:
        """Gradients whose own norm is both the test and the one shown."""
        return cls(grads, grads)

    def shown_norm(self, applied_norm: torch.Tensor) -> torch.Tensor:
        """The unscaled pre-clip norm, unread, given the norm of `applied`; taken before clipping."""
        norm = applied_norm if self.shown is self.applied else norm_of(self.shown)
        if self.scale is None:
            return norm
        return norm.float() / self.scale.to(norm.device).float().reshape(())

    def local_nonfinite(self, sums: list[Any]) -> bool | None:
        """Whether this rank's own gradients held a NaN/Inf, at a step whose reduced ones did."""
        return True if self.solo else any_nonfinite(sums)


def any_nonfinite(sums: list[Any]) -> bool | None:
    """Whether this rank's own gradients held a NaN/Inf; None when unknown (no DDP)."""
    if not sums:
        return None
    return not all(math.isfinite(float(s)) for s in sums)


def gradients(optimizer: Any) -> list[torch.Tensor]:
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def norms_now(applied: list[torch.Tensor], shown: list[torch.Tensor], scale: torch.Tensor | None = None) -> tuple[float, float]:
    """(the global L2 norm of applied, the shown pre-clip norm: shown's, over scale), read on the host;
    inf or nan when the gradients are not finite. Takes lists, not Gradients: called every step."""
    norm = norm_of(applied)
    read = float(norm)
    if shown is applied and scale is None:
        return read, read  # the common case: one read
    return read, float(Gradients(applied, shown, scale).shown_norm(norm))


def norm_of(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of tensors, unread, on the first one's device.

    One CPU tensor (a small model's one bucket) goes to linalg.vector_norm
    directly: on the CPU, _foreach_norm takes each tensor's norm with it, so
    the value is the same to the bit, and between torch's kernels the direct
    call costs about 3 µs less than the foreach op around it (measured in the
    example's step: docs/benchmarks.md). On a GPU the foreach op is one fused
    kernel, and several tensors take one call rather than a Python loop.
    hooks._guard takes the first case inline for the usual CPU step (two
    calls fewer between torch's kernels): a change here goes there too.
    """
    if len(tensors) == 1 and not tensors[0].is_cuda:
        return torch.linalg.vector_norm(tensors[0])
    return _total(torchapi.foreach_norm(tensors))


def _total(norms: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of per-tensor norms, on the first one's device, unread."""
    if len(norms) == 1:
        return norms[0]
    device = norms[0].device
    return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]))


def verdict_late(grads: Gradients, local_sums: list[Any], clip_grad: float | None) -> dict[str, Any]:
    """The guard's record values without reading anything on the host now.

    For a step nobody waits on (policy.GuardPolicy.skips_now): the norm, the
    non-finite flags and the clip flag travel to the host together and are
    read a step late on CUDA (at once on the CPU). Clipping runs on the
    device as clip_grad_norm_ does: scaled by min(1, max_norm / norm), which
    leaves gradients under the norm bitwise alone (a product with 1.0).
    """
    norm = norm_of(grads.applied)
    device = norm.device
    parts = [norm.float(), grads.shown_norm(norm).float()]
    if clip_grad is not None:
        factor = torch.clamp(clip_grad / (norm + CLIP_EPS), max=1.0)
        for group in _by_device(grads.applied).values():
            torchapi.foreach_mul_(group, factor.to(group[0].device))
    if local_sums:
        parts.append(torch.stack([s.to(device) for s in local_sums]).sum())  # non-finite if any sum is
    verdict = torch.stack(parts)

    def fields(v: list[float]) -> dict[str, Any]:
        if not math.isfinite(v[0]):
            local = True if grads.solo else not math.isfinite(v[2]) if len(v) > 2 else None
            return {"nonfinite": True, "local_nonfinite": local}
        return {"grad_norm": v[1], "clipped": None if clip_grad is None else v[0] > clip_grad}

    if not verdict.is_cuda:
        return fields(verdict.tolist())
    read = late.Derived(late.LateTensor(verdict), fields)
    keys = ("grad_norm", "clipped", "nonfinite", "local_nonfinite")
    return {key: late.Derived(read, _field(key)) for key in keys}


def _field(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda values: values.get(key)


def _by_device(tensors: list[torch.Tensor]) -> dict[torch.device, list[torch.Tensor]]:
    groups: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.device, []).append(tensor)
    return groups


def skip(optimizer: Any) -> None:
    """Make optimizer.step() a no-op for this step: no weight or state changes."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None


def clip(grads: list[torch.Tensor], norm: float, max_norm: float) -> bool:
    """Scale grads down to max_norm when over it; whether it did."""
    if norm <= max_norm:
        return False
    torchapi.foreach_mul_(grads, max_norm / (norm + CLIP_EPS))
    return True


def checksum(tensors: Iterable[torch.Tensor]) -> int | late.Late | None:
    """An exact fingerprint of tensors' bits, equal on ranks whose tensors are.

    Each tensor's bits are summed as integers (exact, so the order of the
    reduction cannot matter) and the sums weighted by position, so two
    swapped tensors do not cancel out.
    """
    sums = [t.detach().view(_INT_VIEW[t.element_size()]).sum(dtype=torch.int64) for t in tensors]
    if not sums:
        return None
    if not sums[0].is_cuda:
        return sum((i + 1) * int(s) for i, s in enumerate(sums)) % _MOD
    stacked = torch.stack([s.to(sums[0].device) for s in sums])
    weights = torch.arange(1, len(sums) + 1, device=stacked.device, dtype=torch.int64)
    return late.Derived(late.LateTensor((stacked * weights).sum()), lambda total: total % _MOD)
