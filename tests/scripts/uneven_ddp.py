"""Uneven inputs without DDP's Join: rank r has 20 * (r + 1) batches. Rank 0 runs out first and
exits without error; the others go on into an all-reduce it never joins (on gloo they fail when
its connection closes; on NCCL they would wait until the collective's timeout)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _batch in range(20 * (rank + 1)):
    optimizer.zero_grad()
    model(torch.randn(8, 16)).pow(2).mean().backward()
    optimizer.step()
