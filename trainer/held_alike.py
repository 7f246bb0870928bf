"""What a rank's desync checksum covers: the parameters other ranks hold alike, and which ranks.

DDP's ranks each hold every parameter whole: all of them are compared, with
every rank of the job (or of the rank's data-parallel group). A sharded
model's ranks hold different shards, but HSDP shards within a replica and
replicates across them: a shard is held alike by the ranks that differ only
on the mesh's replicated dimensions (the same place in each replica). So a
DTensor replicated on some dimensions of its mesh and sharded on others is
compared with those ranks; one sharded on every dimension (FSDP2's) has no
twin and is left out, as one with a partial placement, still to be summed.

Asked only on a checksum's step (every --desync-every steps), for each
parameter: the ranks are worked out once for each mesh and placements.
"""

from __future__ import annotations

from typing import Any

import torch

from ddptop.trainer import torchapi

Holders = tuple[int, ...]


def pieces(tensors: list[Any]) -> tuple[list[torch.Tensor], Holders | None]:
    """The plain tensors to checksum, and the ranks that hold them alike (None: every rank that
    holds the plain ones, as for DDP). Plain parameters and DTensors replicated on every
    dimension come first; where there are none, the shards held alike by the most parameters'
    group of ranks."""
    whole: list[torch.Tensor] = []
    shared: dict[Holders, list[torch.Tensor]] = {}
    known: dict[tuple[Any, tuple[Any, ...]], Holders | None] = {}
    for tensor in tensors:
        # Told by type first: a DDP model's every parameter on a checksum's step, and no call for one.
        if type(tensor) is torch.nn.Parameter or type(tensor) is torch.Tensor or not torchapi.is_dtensor(tensor):
            whole.append(tensor)
            continue
        key = (tensor.device_mesh, tuple(tensor.placements))
        if key not in known:
            known[key] = holders(*key)
        held = known[key]
        if held is None:
            whole.append(tensor._local_tensor)
        elif len(held) > 1:
            shared.setdefault(held, []).append(tensor._local_tensor)
    if whole or not shared:
        return whole, None
    held, group = max(shared.items(), key=lambda item: len(item[1]))
    return group, held


def holders(mesh: Any, placements: tuple[Any, ...]) -> Holders | None:
    """The ranks whose local piece of a DTensor on mesh with placements is this rank's: None where
    it is replicated on every dimension (every rank of the mesh); () where no rank's piece can be
    compared (a partial placement, or a rank outside the mesh)."""
    if all(placement.is_replicate() for placement in placements):
        return None
    coordinate = mesh.get_coordinate()
    if coordinate is None or any(placement.is_partial() for placement in placements):
        return ()
    at = tuple(slice(None) if placement.is_replicate() else coordinate[dim] for dim, placement in enumerate(placements))
    return tuple(sorted(int(rank) for rank in mesh.mesh[at].flatten().tolist()))
