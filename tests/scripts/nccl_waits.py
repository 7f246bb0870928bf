"""NCCL all-reduces of a DDP model, then a long sit between steps: what a stuck rank looks like to the flight recorder."""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
model = DistributedDataParallel(nn.Linear(64, 64).cuda(), device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
torch.cuda.synchronize()
print(f"flight recorder buffer {os.environ.get('TORCH_FR_BUFFER_SIZE')}", flush=True)
time.sleep(10)  # sitting on one step: the heartbeats read the recorder
dist.destroy_process_group()
