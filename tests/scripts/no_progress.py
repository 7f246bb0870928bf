"""A DDP script that fails at the same step in every attempt, each time for another reason,
as a flaky node does: no two failures alike, and no attempt gets further than the first."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

REASONS = ["disk quota exceeded", "connection reset by peer", "out of host memory", "bus error reading shard", "bad magic in batch"]

dist.init_process_group("gloo")
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
model = DistributedDataParallel(nn.Linear(8, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    if step == 15 and dist.get_rank() == 1:
        raise RuntimeError(REASONS[attempt % len(REASONS)])
