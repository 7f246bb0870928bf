"""Rank 0 saves a checkpoint to slow storage at --save-at while the other ranks wait at a barrier, as
a script whose master process alone saves does: nothing is wrong, and no alert should come of it.

Slow storage is a file written at --mib-per-s (a network file system, a busy disk): the writes
land in the page cache, as any file's, and the rank sleeps between them, its CPU idle and its
stack on one line.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--save-at", type=int, default=20)
parser.add_argument("--mib", type=int, default=100)
parser.add_argument("--mib-per-s", type=float, default=4.0)
parser.add_argument("--out", required=True)
args = parser.parse_args()


class SlowStorage:
    """A file that takes in --mib-per-s."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 - closed by close()

    def write(self, data: bytes) -> int:
        """A MiB at a time, each followed by its share of the time; torch.save hands a tensor's
        bytes over in one call."""
        view, pause = memoryview(data), 1 / args.mib_per_s
        for start in range(0, len(view), 1 << 20): self.file.write(view[start : start + (1 << 20)]); time.sleep(pause)  # noqa: E701,E702  # fmt: skip  # one line: one place on the stack
        return len(data)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        model(torch.randn(16, 32)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == args.save_at:
            if rank == 0:
                storage = SlowStorage(args.out)
                torch.save({"model": model.state_dict(), "history": torch.zeros(args.mib << 18)}, storage)
                storage.close()
                print(f"saved at step {step}", flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
