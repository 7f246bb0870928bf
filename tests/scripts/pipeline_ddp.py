"""A two-stage pipeline, each stage replicated by DDP over its own process group.

Ranks 0 and 2 hold stage 0, ranks 1 and 3 stage 1: rank 0 feeds rank 1 and
rank 2 feeds rank 3, and DDP all-reduces each stage's gradients over its
replicas alone, as pipeline- and tensor-parallel jobs do. The stages'
parameters differ by design; each stage's replicas' must not.

--drift-at N makes --drift-rank's parameters drift from its replicas' at
step N, outside DDP, as a rank that missed a broadcast would.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--drift-at", type=int, default=-1)
parser.add_argument("--drift-rank", type=int, default=2)
parser.add_argument("--stuck-at", type=int, default=-1, help="--stuck-rank sleeps for good before this step's batch")
parser.add_argument("--stuck-rank", type=int, default=3)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
stage = rank % 2
replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank makes every group, in one order
torch.manual_seed(stage)
model = DistributedDataParallel(
    nn.Sequential(nn.Linear(16, 32), nn.Tanh()) if stage == 0 else nn.Linear(32, 1), process_group=replicas[stage]
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
peer = rank + 1 if stage == 0 else rank - 1
torch.manual_seed(100 + rank)
for step in range(args.steps):
    optimizer.zero_grad()
    if step == args.stuck_at and rank == args.stuck_rank:
        time.sleep(3600)
    if stage == 0:
        out = model(torch.randn(args.batch_size, 16))
        dist.send(out.detach(), peer)
        grad = torch.empty_like(out)
        dist.recv(grad, peer)
        out.backward(grad)
    else:
        act = torch.empty(args.batch_size, 32)
        dist.recv(act, peer)
        act.requires_grad_()
        loss = model(act).pow(2).mean()
        loss.backward()
        dist.send(act.grad, peer)
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    optimizer.step()
    if step == args.drift_at and rank == args.drift_rank:
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
dist.destroy_process_group()
