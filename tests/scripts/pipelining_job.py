"""torchtitan's pipeline: torch.distributed.pipelining's GPipe schedule over two stages, each
stage's module sharded by FSDP2 over its two data-parallel ranks (a 2 x 2 mesh, gloo).

The last stage's ranks print, per step, the loss as torchtitan logs it (the mean of the
micro-batches' losses) as `[loss] STEP VALUE`, so a test can compare what ddptop shows. With
--clip every rank clips as torchtitan does: each stage's norm (get_total_norm), the stages'
added over the pipeline's ranks, then clip_grads_with_norm_ by that global norm, printed as
`[norm] STEP VALUE`.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--clip", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
pp, dp = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
torch.manual_seed(pp)
module = nn.Sequential(nn.Linear(16, 32), nn.Tanh()) if pp == 0 else nn.Linear(32, 1)
fully_shard(module, mesh=mesh["dp"])
stage = PipelineStage(module, pp, 2, torch.device("cpu"), group=mesh["pp"].get_group())
schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=nn.functional.mse_loss)
optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(dp)
for step in range(args.steps):
    x, y = torch.randn(16, 16, generator=data), torch.randn(16, 1, generator=data)
    if pp == 0:
        schedule.step(x)
    else:
        losses: list[torch.Tensor] = []
        schedule.step(target=y, losses=losses)
        print(f"[loss] {step} {torch.stack(losses).mean().item()!r}", flush=True)
    if args.clip:
        norm = torch.nn.utils.get_total_norm([p.grad for p in module.parameters()]).full_tensor() ** 2
        dist.all_reduce(norm, group=mesh["pp"].get_group())
        norm = norm.sqrt()
        torch.nn.utils.clip_grads_with_norm_(module.parameters(), 1.0, norm)
        print(f"[norm] {step} {norm.item()!r}", flush=True)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
