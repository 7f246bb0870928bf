"""Rank 0 calls monitor.step in a tight loop, far above any sane rate; rank 1 trains at a normal pace.

Between the two, one all-reduce: rank 1 waits there until rank 0 has
flooded, then both train --steps more steps.
"""

import argparse

import torch
import torch.distributed as dist

from ddptop.trainer import monitor

parser = argparse.ArgumentParser()
parser.add_argument("--calls", type=int, default=200_000)
parser.add_argument("--steps", type=int, default=50)
args = parser.parse_args()

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    for n in range(args.calls):
        monitor.step(loss=float(n))
dist.all_reduce(torch.ones(1))
for _ in range(args.steps):
    dist.all_reduce(torch.ones(1024))
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
