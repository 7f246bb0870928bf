"""A DDP job of 3 ranks that hangs at step 20 the way real jobs do, as --mode says:

- skip: rank 2 takes a branch the others do not and never calls the metric all-reduce they wait in;
- sigstop: rank 2 is stopped (SIGSTOP), as a debugger or a frozen node leaves it;
- native: rank 2 is in a long native call that holds the GIL (a catastrophic regex);
- subgroup: ranks 0 and 1 share a validation result over their own group; rank 1 skips the
  broadcast rank 0 sends, and everyone then waits for a checkpoint, so only that group hangs.

--mark FILE: the rank that hangs writes when it did (the onset).
--go FILE: at step 20 every rank waits for FILE first: the test makes it once every rank has
  been heard from, since a rank that stops or holds the GIL before its first word to ddptop
  is a rank ddptop never knew (a case of its own).
"""

import argparse
import os
import re
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("skip", "sigstop", "native", "subgroup"), required=True)
parser.add_argument("--mark")
parser.add_argument("--go")
args = parser.parse_args()


def mark() -> None:
    if args.mark:
        with open(args.mark, "w") as out:
            out.write(str(time.time()))


def wait_for_go() -> None:
    deadline = time.monotonic() + 120
    while args.go and not os.path.exists(args.go) and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_for_checkpoint() -> None:
    time.sleep(600)  # every rank sits here once its own part is done


def validate(sub: dist.ProcessGroup, rank: int) -> None:
    score = torch.tensor([float(rank)])
    if rank == 0:
        dist.broadcast(score, 0, group=sub)  # rank 1 was meant to receive it
    elif rank == 1:
        mark()  # ... but skips it


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sub = dist.new_group([0, 1])
    if rank in (0, 1):
        dist.broadcast(torch.zeros(1), 0, group=sub)  # the pair's first collective, which both make
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1000):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 20:
            wait_for_go()
        if step == 20 and rank == 2 and args.mode == "sigstop":
            mark()
            os.kill(os.getpid(), signal.SIGSTOP)
        if step == 20 and rank == 2 and args.mode == "native":
            mark()
            re.match(r"(a+)+$", "a" * 64 + "b")  # holds the GIL for longer than anyone waits
        if step == 20 and args.mode == "subgroup":
            if rank in (0, 1):
                validate(sub, rank)
            wait_for_checkpoint()
        metric = loss.detach().clone()
        if step == 20 and rank == 2 and args.mode == "skip":
            mark()
            wait_for_checkpoint()  # rank 2's branch: no all-reduce of the metric
        dist.all_reduce(metric)


main()
