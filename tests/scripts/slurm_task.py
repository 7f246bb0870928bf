"""One task of a job srun started: its rank and world from SLURM's variables, as Lightning and
torchtitan read them under SLURM. It knows nothing of torchrun or ddptop."""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
model = DistributedDataParallel(nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.monotonic() + float(os.environ.get("TASK_SECONDS", "600"))
while True:
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    done = torch.tensor([float(time.monotonic() > end)])
    dist.all_reduce(done)  # rank 0's clock and rank 1's agree on the last step
    if done.item() > 0:
        break
    time.sleep(0.01)
dist.destroy_process_group()
