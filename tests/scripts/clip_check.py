"""A DDP script that never clips and whose gradients are huge.

It registers its own optimizer pre-hook, which torch runs after the global
ones (ddptop's), to see the gradients the optimizer really applies, and
prints the largest norm it saw: with `ddptop launch --clip-grad 1.0` that
must be at most 1.0. It also prints whether DDP made its gradients views of its
buckets, which it does not say itself (`ddptop launch --bucket-view` does).
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
applied: list[float] = []


def see_applied(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    applied.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())


optimizer.register_step_pre_hook(see_applied)
for _step in range(args.steps):
    optimizer.zero_grad()
    (model(torch.randn(8, 16)).pow(2).sum() * 1e4).backward()
    optimizer.step()
print(f"applied-steps {len(applied)} max-applied-grad-norm {max(applied):.9f} bucket-view {model.gradient_as_bucket_view}", flush=True)
dist.destroy_process_group()
