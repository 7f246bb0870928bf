"""nanoGPT's shape: every --eval-interval steps the master process alone evaluates, the others wait.

Rank 0 runs forwards of the DDP model in eval mode, under no_grad, for
--eval-seconds; the other ranks go on into the next step and wait for it in
the all-reduce. Nothing is wrong: no alert should come of it.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--eval-interval", type=int, default=100)
parser.add_argument("--eval-seconds", type=float, default=40.0)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()


@torch.no_grad()
def estimate_loss(model: nn.Module) -> float:
    model.eval()
    losses = []
    end = time.monotonic() + args.eval_seconds
    while time.monotonic() < end:
        x, y = torch.randn(args.batch_size, 32), torch.randint(0, 4, (args.batch_size,))
        losses.append(nn.functional.cross_entropy(model(x), y).item())
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    dist.init_process_group("gloo")
    master_process = dist.get_rank() == 0
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for iter_num in range(args.steps):
        if iter_num % args.eval_interval == 0 and iter_num > 0 and master_process:
            print(f"step {iter_num}: val loss {estimate_loss(model):.4f}", flush=True)
        x, y = torch.randn(args.batch_size, 32), torch.randint(0, 4, (args.batch_size,))
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
