"""A DDP script whose data loader blocks forever on one rank, as a dead network filesystem would.

Map-style dataset, DistributedSampler, DataLoader: the usual shape. On
--stuck-rank, fetching the batch of step --stuck-at blocks in the dataset's
__getitem__; the other ranks go on into that step's all-reduce and wait
there. With --mark, the stuck rank writes the time it blocked to that file.
"""

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--stuck-rank", type=int, default=1)
parser.add_argument("--stuck-at", type=int, default=30)
parser.add_argument("--mark", default=None)
args = parser.parse_args()


class Shards(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.served = 0

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rank == args.stuck_rank and self.served == args.stuck_at * args.batch_size:
            if args.mark:
                with open(args.mark, "w") as mark:
                    mark.write(str(time.time()))
            threading.Event().wait()  # stuck here
        self.served += 1
        generator = torch.Generator().manual_seed(index)
        return torch.randn(32, generator=generator), torch.randint(0, 4, (), generator=generator)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Shards(rank)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, shuffle=False))
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
    print(f"rank {rank} done at pid {os.getpid()}")


if __name__ == "__main__":
    main()
