"""A plain DDP script that knows nothing of ddptop: zero-code instrumentation's test subject.

Two forwards per optimizer step (gradient accumulation) so samples per step
are the sum of both batch dimensions.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for _step in range(args.steps):
    optimizer.zero_grad()
    for micro in range(2):
        x = torch.randn(args.batch_size, 32)
        with model.no_sync() if micro == 0 else torch.enable_grad():
            model(x).pow(2).mean().backward()
    optimizer.step()
dist.destroy_process_group()
