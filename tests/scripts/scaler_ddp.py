"""A DDP script with torch.amp.GradScaler whose gradients overflow on purpose.

At the steps given by --inf-at, one gradient becomes inf as backward makes
it; the scaler sees it and skips optimizer.step(), as mixed precision
training does all the time. ddptop must call that a scaler skip, not a
NaN fault.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--inf-at", type=int, action="append", default=[])
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu")
first = next(model.parameters())


def overflow(grad: torch.Tensor) -> torch.Tensor:
    grad = grad.clone()
    grad.view(-1)[0] = float("inf")
    return grad


for step in range(args.steps):
    optimizer.zero_grad()
    handle = first.register_hook(overflow) if step in args.inf_at else None
    scaler.scale(model(torch.randn(8, 16)).pow(2).mean()).backward()
    if handle is not None:
        handle.remove()
    scaler.step(optimizer)
    scaler.update()
dist.destroy_process_group()
