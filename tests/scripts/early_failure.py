"""A DDP script that fails the same way before its first step every time, as a typo does."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(nn.Linear(8, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model.module.to_device("cpu")  # no such method: AttributeError, at this line, in every attempt
