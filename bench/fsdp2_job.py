"""The example's loop with its model sharded by FSDP2, as one of bench/inrank.py's jobs (`--model fsdp2`).

torchtitan's way: fully_shard on each Linear layer, then on the model, over
every rank (a 1-D mesh), so that each parameter and gradient is a DTensor
holding this rank's shard. The loop is the example's (Job.run): its loader,
its loss, an SGD optimizer with momentum; the script clips nothing, so
ddptop's guard takes the norms of the rank's shards and sends its share of
the grad norm's square (trainer/shard_share.py). With `--hsdp R` the mesh is
2-D, R replicas across, as HSDP shards.
"""

from __future__ import annotations

import argparse
from typing import Any

from inrank import Job


class Fsdp2Job(Job):
    """One copy of the example's loop, its model sharded by fully_shard."""

    def __init__(self, args: argparse.Namespace, example: Any, torch_device: Any) -> None:
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        self.device = torch_device
        model = example.make_model(args.width).to(torch_device)
        mesh = None
        if args.hsdp > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(
                torch_device.type, (args.hsdp, dist.get_world_size() // args.hsdp), mesh_dim_names=("replicate", "shard")
            )
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        self.model = fully_shard(model, mesh=mesh)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        data_args = argparse.Namespace(seed=0, samples=max(8192, 2 * args.batch_size), batch_size=args.batch_size)
        loader = example.make_loader(data_args, dist.get_rank(), dist.get_world_size())
        self.data = example.batches(loader, 0, 0)
