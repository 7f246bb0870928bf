"""A model sharded with FSDP1 (FullyShardedDataParallel, each Linear its own unit by an auto-wrap
policy, as Accelerate's and Lightning's FSDP wrap a transformer's blocks), on gloo, with AdamW and
the model's own clip_grad_norm_. ddptop is never mentioned.

Each rank prints, per step, its loss and the global norm its clip_grad_norm_ returned, as
`[loss] STEP VALUE` and `[norm] STEP VALUE`, so a test can compare what ddptop shows with them.
With --no-clip it does not clip, and prints the global norm it measured itself: its shards' sum
of squares, all-reduced. With --orig, FSDP keeps the original parameters (use_orig_params), each
a view of its rank's shard, for the optimizer. With --inf-at STEP, rank 1's loss at that step is
infinite.
"""

import argparse
import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--no-clip", action="store_true")
parser.add_argument("--orig", action="store_true")
parser.add_argument("--inf-at", type=int)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
wrap = functools.partial(ModuleWrapPolicy, {nn.Linear})()
model = FullyShardedDataParallel(model, auto_wrap_policy=wrap, device_id=torch.device("cpu"), use_orig_params=args.orig)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(rank)
for step in range(args.steps):
    x = torch.randn(16, 32, generator=data)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    if step == args.inf_at and rank == 1:
        loss = loss * float("inf")
    loss.backward()
    if args.no_clip:
        squares = sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None)
        dist.all_reduce(squares)
        norm = squares.sqrt()
    else:
        norm = model.clip_grad_norm_(1.0)
    optimizer.step()
    optimizer.zero_grad()
    print(f"[loss] {step} {loss.item()!r}\n[norm] {step} {norm.item()!r}", flush=True)
dist.destroy_process_group()
