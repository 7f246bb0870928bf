"""A model sharded with FSDP2's fully_shard (torchtitan's way: each layer, then the root), on
gloo, with AdamW and the script's own clip_grad_norm_. ddptop is never mentioned.

Each rank prints, per step, its loss and the norm its clip_grad_norm_ returned (a DTensor:
`.full_tensor()`), as `[loss] STEP VALUE` and `[norm] STEP VALUE`, so a test can compare
what ddptop shows with them. With --no-clip it does not clip, and prints the gradients'
global norm it measured itself (each gradient gathered whole). With --tp N its first two
layers are split over N ranks by tensor parallelism, as torchtitan does, and fully_shard
shards over the other dimension of the mesh: the ranks of one tensor-parallel group are
given the same batch. Every layer is split, so that every parameter is on the one 2-D mesh
clip_grad_norm_ takes; with --tp-last-plain the last layer is left whole, sharded by FSDP alone
over a 1-D mesh, as a model's head often is (then only --no-clip's own norm works: torch's
clip_grad_norm_ cannot stack norms of two meshes). With --tp-only every layer is split over
all the ranks by tensor parallelism and nothing else shards it, as torchtitan leaves a job
with no data-parallel degree: every rank is given the same batch. With --hsdp R it is HSDP, as torchtitan's
data_parallel_replicate_degree makes it: fully_shard on a 2-D mesh, R replicas across, each
sharded over the rest of the ranks, every rank given a batch of its own. With --nudge-at S
--nudge-rank R, rank R adds a little to its shard of the first layer's weight before step S's
update, as a flipped bit or a rank that skipped a step alone would leave its shard apart from
its replica's. With --slow-data-rank R --slow-data-ms MS, rank R waits MS ms for each batch,
as a rank whose loader falls behind does. With --slow-compute-rank R --slow-compute-ms MS,
rank R spends MS ms more between its forward and its backward, as a rank on a slower or
throttled GPU does. With --nan-at S --nan-rank R, rank R's loss at step S
is infinite. With --bf16 it computes in bfloat16 and reduces in float32, as torchtitan's
mixed_precision_param does (FSDP2's MixedPrecisionPolicy). With --own-scale each rank scales
the output by a parameter of its own (1 + its rank), which fully_shard is told to ignore, as a
mixture of experts keeps an expert on each rank: its --no-clip norm counts every rank's.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--no-clip", action="store_true")
parser.add_argument("--tp", type=int, default=1)
parser.add_argument("--tp-last-plain", action="store_true")
parser.add_argument("--tp-only", action="store_true")
parser.add_argument("--hsdp", type=int, default=1)
parser.add_argument("--nudge-at", type=int, default=-1)
parser.add_argument("--nudge-rank", type=int, default=-1)
parser.add_argument("--slow-data-rank", type=int, default=-1)
parser.add_argument("--slow-data-ms", type=float, default=0.0)
parser.add_argument("--slow-compute-rank", type=int, default=-1)
parser.add_argument("--slow-compute-ms", type=float, default=0.0)
parser.add_argument("--nan-at", type=int, default=-1)
parser.add_argument("--bf16", action="store_true")
parser.add_argument("--nan-rank", type=int, default=-1)
parser.add_argument("--own-scale", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
mesh = None
if args.tp_only:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    args.tp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (args.tp,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": RowwiseParallel(input_layouts=Replicate())})
elif args.tp > 1:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size() // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    if not args.tp_last_plain:
        plan["4"] = RowwiseParallel(input_layouts=Replicate())
    parallelize_module(model, mesh["tp"], plan)
    mesh = mesh["dp"]
elif args.hsdp > 1:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (args.hsdp, dist.get_world_size() // args.hsdp), mesh_dim_names=("replicate", "shard"))
precision = {}
if args.bf16:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    precision["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
if not args.tp_only:
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **precision)
    if args.own_scale:
        model.own = nn.Parameter(torch.full((1,), 1.0 + rank))
        precision["ignored_params"] = {model.own}
    fully_shard(model, mesh=mesh, **precision)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(rank // args.tp)
for step in range(args.steps):
    if rank == args.slow_data_rank:
        time.sleep(args.slow_data_ms / 1000)
    x = torch.randn(16, 32, generator=data)
    out = model(x) * model.own if args.own_scale else model(x)
    loss = nn.functional.mse_loss(out, x.sum(1, keepdim=True))
    if rank == args.slow_compute_rank:
        time.sleep(args.slow_compute_ms / 1000)
    if step == args.nan_at and rank == args.nan_rank:
        loss = loss * float("inf")
    loss.backward()
    if args.no_clip:
        sharded = [p for p in model.parameters() if p is not getattr(model, "own", None)]
        norm = torch.linalg.vector_norm(torch.stack([p.grad.full_tensor().norm() for p in sharded]))
        if args.own_scale:  # every rank's own, each a piece of the whole
            own = model.own.grad.norm() ** 2
            dist.all_reduce(own)
            norm = (norm**2 + own).sqrt()
    else:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor()
    if step == args.nudge_at and rank == args.nudge_rank:
        with torch.no_grad():
            model[0].weight.to_local().add_(1e-3)
    optimizer.step()
    optimizer.zero_grad()
    print(f"[loss] {step} {loss.item()!r}\n[norm] {step} {norm.item()!r}", flush=True)
dist.destroy_process_group()
