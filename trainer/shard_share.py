"""A sharded step's grad norm with no collective of ddptop's: each rank's share of its square.

The squared norm of the full gradients is the sum, over every distinct piece
of them, of that piece's squared norm. A rank holds some pieces: its shards
of the DTensors that FSDP2 or tensor parallelism split, and the replicated
ones that other ranks hold too. So each rank weighs its shards' squared
norms by one over the ranks that hold the same piece: a dimension of the
gradient's mesh it is replicated over (HSDP's replicas, the tensor-parallel
ranks of a norm layer's weight) multiplies the holders, a dimension it is
sharded over does not. The supervisor adds the ranks' shares for a step
(core/model/sharded_norm.py), which gives the norm clip_grad_norm_ would
return, without a collective inside the step. Each share is a sum the host
makes on the sender's thread from the per-gradient norms the step's pack
already holds (guard.Layout.fields): nothing is added to the training thread.

A gradient that is a plain tensor in a sharded job (a parameter fully_shard
left out) is held whole by each rank, and no rank's is the others': it is
taken as their mean, weighed by one over the world. One whose parameter
fully_shard was told to ignore is the rank's own (an expert of its own, in a
mixture of experts): a piece no other rank holds, weighed by one. A partial placement
(values still to be summed over ranks) has no norm of its own until
reduced: a step with one gives no share.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from ddptop.trainer import torchapi


class Weights:
    """One over the ranks that hold each gradient's local piece, in the optimizer's order.

    Kept by identity (Probe.gradients) and hashed by it, so that a step's layout key costs no
    hash of a model's worth of floats."""

    __slots__ = ("of",)

    def __init__(self, of: tuple[float, ...]) -> None:
        self.of = of


def weights(grads: list[Any], world: int, own: tuple[bool, ...] = ()) -> Weights | None:
    """Each gradient's weight in its rank's share, own saying which are the rank's own (of
    parameters fully_shard ignored; none where empty); None where a gradient has a partial
    placement. Asked once for each optimizer and count of gradients (Probe.gradients)."""
    found = []
    for at, grad in enumerate(grads):
        if not torchapi.is_dtensor(grad):
            found.append(1.0 if at < len(own) and own[at] else 1.0 / max(1, world))
            continue
        holders = 1
        mesh = grad.device_mesh
        for dim, placement in enumerate(grad.placements):
            if placement.is_partial():
                return None
            if placement.is_replicate():
                holders *= mesh.size(dim)
        found.append(1.0 / holders)
    return Weights(tuple(found))


def share(norms: list[float], weights: Weights, grad_scale: float = 1.0) -> float:
    """This rank's share of the step's squared grad norm, from its local pieces' norms (unscaled
    by a fused optimizer's grad_scale, as the norm is)."""
    return math.fsum(map(operator.mul, weights.of, (n * n for n in norms))) / (grad_scale * grad_scale)
