"""An image classifier's training script, as the widely used ones are written: its own --clip-grad,
DDP built with broadcast_buffers, and a validation every epoch through the module DDP wraps (or
its EMA copy), under no_grad, on every rank.

Each rank writes the options it was given to --out (rank N's beside it, `.N`), so a test reads
what reached the script.
"""

import argparse
import copy
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--clip-grad", type=float, default=None, help="clip gradient norm (default: none)")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps-per-epoch", type=int, default=20)
parser.add_argument("--val-batches", type=int, default=30)
parser.add_argument("--model-ema", action="store_true", help="validate an EMA copy of the model")
parser.add_argument("--out", default=None)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def validate(model: nn.Module, batches: int) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for _ in range(batches):
            x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
            correct += int((model(x).argmax(dim=1) == y).sum())
    return correct / (256 * batches)


def main() -> None:
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.out:
        with open(f"{args.out}.{rank}", "w") as out:
            json.dump(vars(args), out)
    torch.manual_seed(0)
    model = DDP(Net(), broadcast_buffers=False)
    ema = copy.deepcopy(model.module) if args.model_ema else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for epoch in range(args.epochs):
        model.train()
        for _ in range(args.steps_per_epoch):
            x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if args.clip_grad is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            optimizer.step()
        accuracy = validate(ema if ema is not None else model.module, args.val_batches)
        print(f"epoch {epoch}: top-1 {accuracy:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
