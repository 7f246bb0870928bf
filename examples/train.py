"""ddptop's example job: a small MLP on synthetic data, plain DDP.

Runs anywhere: NCCL on GPUs, gloo on CPU ranks. It needs no download, and
uses ddptop's optional API for the loss, exact sample counts and the step
count (for the dashboard's ETA); everything else ddptop measures alone.

    ddptop launch examples/train.py --gpus 4 --steps 200
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddptop.trainer import monitor


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def batch(step: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data, a function of (step, rank) so a rerun sees the same batches."""
    gen = torch.Generator().manual_seed(step * 100_003 + rank)
    x = torch.randn(size, 64, generator=gen)
    y = (x[:, :10].sum(dim=1) > 0).long() + 2 * (x[:, 10:20].sum(dim=1) > 0).long()
    return x.to(device), y.to(device)


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(make_model(args.width).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    monitor.configure(total_steps=args.steps)
    warmup = min(10, args.steps - 1)
    for step in range(args.steps):
        if step == warmup:
            timed_from = time.perf_counter()
        x, y = batch(step, rank, args.batch_size, device)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        monitor.step(loss=loss, samples=x.shape[0])
        if rank == 0 and (step % 100 == 0 or step == args.steps - 1):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        rate = (args.steps - warmup) / (time.perf_counter() - timed_from)
        print(f"train-steps-per-s {rate:.2f}", flush=True)
        print(f"final-params-sha256 {params_sha256(model.module)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
