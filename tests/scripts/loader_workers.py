"""DataLoader workers started by fork and by spawn, and a torch.multiprocessing
child, from a DDP rank: what a script forked from ddptop's template must
still do as under torchrun. Each rank prints one line of what it got."""

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    """Defined in __main__: a spawned worker must import it from the script."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i * i)])


def child(value: int, out) -> None:
    out.put((value * 2, os.getppid()))


def main() -> None:
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    totals = {}
    for method in ("fork", "spawn"):
        total = 0.0
        for batch in DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context=method):
            model(batch).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            total += float(batch.sum())
        totals[method] = total
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=child, args=(21, queue))
    process.start()
    doubled, parent = queue.get(timeout=60)
    process.join()
    mine = "mine" if parent == os.getpid() else f"not mine ({parent})"
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_text().replace("\0", " ")
    print(f"rank {dist.get_rank()} started by {parent}", flush=True)
    print(f"rank {dist.get_rank()}: fork {totals['fork']:.0f} spawn {totals['spawn']:.0f} mp {doubled} {mine}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
