"""A DDP job whose run directory's disk fills and empties under it, or vanishes, as shared servers do.

--free-at STEP removes --filler (space comes back); --fill-at STEP writes
--filler until the disk is full; --remove-run-at STEP deletes the run
directory ddptop writes to (found from the socket address ddptop gives the
ranks). Only rank 0 does it. Each step sleeps --step-s so that the
supervisor, which writes its log once a second, sees each weather.
"""

import argparse
import os
import shutil
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--step-s", type=float, default=0.02)
parser.add_argument("--filler", default=None)
parser.add_argument("--fill-at", type=int, action="append", default=[])
parser.add_argument("--free-at", type=int, action="append", default=[])
parser.add_argument("--remove-run-at", type=int, default=None)
args = parser.parse_args()


def fill(path: str) -> None:
    with open(path, "ab") as out:
        try:
            while True:
                out.write(b"\0" * (1 << 16))
                out.flush()
        except OSError:
            return


def main() -> None:
    dist.init_process_group("gloo")
    weather = dist.get_rank() == 0
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if weather and step in args.free_at and args.filler and os.path.exists(args.filler):
            os.unlink(args.filler)
        if weather and step in args.fill_at and args.filler:
            fill(args.filler)
        if weather and step == args.remove_run_at:
            shutil.rmtree(os.path.dirname(os.environ["DDPTOP_ADDRESS"].removeprefix("unix:")))
        x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        time.sleep(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
