"""All-reduces of a known size, timed two ways: by DDP (what ddptop reports) and by the script.

One Linear layer of 2048 x 2048 floats (16 MiB, one parameter, so one bucket)
trains for --seconds (by rank 0's clock), DDP timing every iteration (its runtime logging sample
rate set to 1) so that ddptop's once-a-second reading has a fresh sample
each time. Then the script times dist.all_reduce of a tensor of the same
size itself and prints the median: `allreduce-ms X`.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=4.0)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(2048, 2048, bias=False))
model._set_ddp_runtime_logging_sample_rate(1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(4, 2048)
end = time.monotonic() + args.seconds
going = torch.ones(1)
while going.item():
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    # Rank 0's clock ends the loop for every rank: by each rank's own, one rank could train a
    # step more, and its DDP all-reduce would pair with the other's first timed one below.
    going.fill_(time.monotonic() < end)
    dist.broadcast(going, 0)
buffer = torch.randn(2048 * 2048)
took = []
for _ in range(15):
    start = time.perf_counter()
    dist.all_reduce(buffer)
    took.append((time.perf_counter() - start) * 1e3)
if dist.get_rank() == 0:
    print(f"allreduce-ms {statistics.median(took):.3f}", flush=True)
dist.destroy_process_group()
