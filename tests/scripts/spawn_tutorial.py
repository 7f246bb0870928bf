"""A script that starts its own ranks, written as PyTorch's DDP tutorial teaches:
mp.spawn, MASTER_ADDR/MASTER_PORT set in the script, rank and world size given
to init_process_group. It knows nothing of ddptop or torchrun.

--nan-at STEP makes rank 1's loss NaN at that step; --step-s slows each step.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size, args):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size, args.port)
    torch.manual_seed(rank)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for step in range(args.steps):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss = loss_fn(outputs, labels)
        if step == args.nan_at and rank == 1:
            loss = loss * float("nan")
        loss.backward()
        optimizer.step()
        time.sleep(args.step_s)
    print(f"rank {rank} done: {sum(p.sum().item() for p in model.parameters()):.6f}")
    cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--nan-at", type=int, default=-1)
    parser.add_argument("--port", type=int, default=12355)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    mp.spawn(demo_basic, args=(args.world_size, args), nprocs=args.world_size, join=True)
