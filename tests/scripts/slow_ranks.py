"""Two ranks, each slow in its own way, for `ddptop profile` to tell apart.

Rank 0's data loader sleeps in every batch (--data-ms); rank 1's model does
extra matrix products in its forward for --compute-ms. Both are times, not
counts of work: a faster machine would otherwise shrink rank 1's extra
forward below what `ddptop profile` calls a difference. Under DDP the other
rank waits for each in the all-reduce. It runs until --seconds have passed.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=60.0)
parser.add_argument("--data-ms", type=float, default=40.0)
parser.add_argument("--compute-ms", type=float, default=15.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()


class Batches(Dataset):
    """A batch per item: the loader's one call a step, slow on rank 0."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if rank == 0:
            time.sleep(args.data_ms / 1000)
        return torch.randn(32, 128), torch.randint(0, 8, (32,))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 8))
        self.extra = torch.randn(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if rank == 1:
            h = torch.randn(32, 256)
            until = time.perf_counter() + args.compute_ms / 1000
            while time.perf_counter() < until:
                h = torch.tanh(h @ self.extra)
        return self.body(x)


torch.manual_seed(0)
model = DistributedDataParallel(Model())
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
end = time.monotonic() + args.seconds
for x, y in DataLoader(Batches(), batch_size=None):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if time.monotonic() > end:
        break
dist.destroy_process_group()
