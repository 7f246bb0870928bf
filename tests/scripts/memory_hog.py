"""Rank 1 holds on to 400 MB more at each step from step 30, as a leak does (a list of every
batch's outputs, a cache that never empties), until the memory it may use runs out."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for step in range(60):
    model(torch.randn(8, 32)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    if rank == 1 and step >= 30:
        kept.append(torch.ones(100_000_000))
dist.destroy_process_group()
