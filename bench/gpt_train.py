"""A nanoGPT-sized training job, the loop bench/nanogpt.py times with and without ddptop.

A GPT of nanoGPT's character-level size (6 layers of width 384, 6 heads,
256 tokens of context, batch 64), trained the way nanoGPT's train.py does
it: bf16 autocast (a GradScaler enabled only for fp16), gradients clipped
to 1.0 by the script itself, torch's fused AdamW on a GPU, the loss read on
the host every 10 iterations for the log. The tokens are random (nothing
to download); the cost of a step does not depend on them. It knows nothing
of ddptop, but for one switch of bench/nanogpt.py's: with BENCH_UNHOOKED=1
in a run under ddptop it takes ddptop's torch hooks out again
(patches.undo()), so that run pays for everything of ddptop but the hooks
(`--also unhooked=BENCH_UNHOOKED=1`).

Rank 0 prints `iter-ms X`: the wall time of the iterations after the
warm-up over their number, the device synchronised at both ends (what a
user's tokens/s is made of). Then, on Linux, a `sched` line for each of its
threads that ran in that window: its time on a CPU and its time runnable
but waiting for one (the kernel's schedstat), each per iteration: what
tells a thread that works longer from one that waits for a core. On a
GPU, last, `gpu-busy-ms X of Y` over a few more iterations traced with
torch.profiler: the time an iteration in which a kernel ran, of its wall
time, and the kernels it ran: a job whose GPU idles between kernels is
bound by its host's launches, and pays for every microsecond of CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

if os.environ.get("BENCH_UNHOOKED") and "ddptop.trainer.hooks" in sys.modules:
    from ddptop.trainer import patches

    patches.undo()


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2 if self.training else 0.0, is_causal=True)
        x = x + self.drop(self.out(attended.transpose(1, 2).reshape(batch, length, width)))
        return x + self.drop(self.down(F.gelu(self.up(self.norm2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int, width: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        for name, param in self.named_parameters():
            if name.endswith("weight") and param.dim() == 2:
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * layers) if name.endswith(("out.weight", "down.weight")) else 0.02)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


VOCAB = 65
"""nanoGPT's character-level vocabulary."""

LOSS_READ_EVERY = 10


def make(
    device: torch.device, context: int, layers: int, width: int, heads: int, vocab: int = VOCAB, bucket_view: bool = False
) -> tuple[DistributedDataParallel, torch.optim.Optimizer, torch.amp.GradScaler]:
    """The GPT under DDP on device (its gradients views of DDP's buckets with bucket_view), its
    optimizer (torch's fused AdamW on a GPU) and its GradScaler (off: bf16 autocast, which
    nanoGPT's enables only for fp16); seed torch first."""
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = DistributedDataParallel(
        GPT(vocab, context, layers, width, heads).to(device),
        device_ids=[device.index] if cuda else None,
        gradient_as_bucket_view=bucket_view,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=cuda)
    return model, optimizer, torch.amp.GradScaler(device.type, enabled=False)


def batch(batch_size: int, context: int, device: torch.device, vocab: int = VOCAB) -> torch.Tensor:
    """Random token ids, one more than the context a sample: inputs and their next tokens."""
    return torch.randint(vocab, (batch_size, context + 1), device=device)


def loss_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The forward under bf16 autocast: the loss of predicting each next token."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16):
        return model(ids[:, :-1], ids[:, 1:])


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, ids: torch.Tensor, iteration: int) -> None:
    """One of nanoGPT's iterations on a batch of token ids (bench/gpt_job.py runs it too)."""
    loss = loss_of(model, ids)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if iteration % LOSS_READ_EVERY == 0:
        loss.item()  # nanoGPT's log line: the host waits for the device every 10 iterations


def thread_times() -> dict[str, tuple[str, int, int]]:
    """This process's threads by id: name, ns on a CPU, ns runnable and waiting for one ({} off Linux)."""
    times: dict[str, tuple[str, int, int]] = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            on_cpu, waiting, _ = (int(part) for part in (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        times[task.name] = (name, on_cpu, waiting)
    return times


def sched_lines(before: dict[str, tuple[str, int, int]], after: dict[str, tuple[str, int, int]], iters: int) -> list[str]:
    """One line a thread that ran between the two readings: ms on a CPU and ms waiting for one, an iteration."""
    lines = []
    for tid, (name, on_cpu, waiting) in sorted(after.items(), key=lambda item: -item[1][1]):
        _, cpu0, wait0 = before.get(tid, (name, 0, 0))
        if on_cpu - cpu0 > 0:
            lines.append(
                f"sched {name} ({tid}): cpu {(on_cpu - cpu0) / 1e6 / iters:.3f} ms/iter, runqueue {(waiting - wait0) / 1e6 / iters:.3f} ms/iter"
            )
    return lines


def gpu_busy(step: Callable[[int], None], iters: int) -> str:
    """`gpu-busy-ms X of Y, K kernels`: kernel time (their union) and wall time an
    iteration over iters iterations traced with torch.profiler, and kernels an iteration."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as traced:
        started = time.perf_counter()
        for iteration in range(iters):
            step(iteration)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    spans = sorted((e.time_range.start, e.time_range.end) for e in traced.events() if e.device_type == DeviceType.CUDA)
    busy, reach = 0.0, float("-inf")
    for start, end in spans:
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return f"gpu-busy-ms {busy / 1e3 / iters:.3f} of {wall * 1e3 / iters:.3f}, {len(spans) / iters:.0f} kernels"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=250)
    parser.add_argument("--warmup", type=int, default=50, help="iterations left out of the median")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--traced", type=int, default=20, help="iterations traced on a GPU for gpu-busy-ms (0: none)")
    args = parser.parse_args()
    if args.width % args.heads:
        parser.error(f"--width {args.width} is not a multiple of --heads {args.heads}: each head takes width/heads")

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(1337 + dist.get_rank())
    model, optimizer, scaler = make(device, args.context, args.layers, args.width, args.heads, args.vocab)

    def step(iteration: int) -> None:
        train_step(model, optimizer, scaler, batch(args.batch_size, args.context, device, args.vocab), iteration)

    started, threads = time.perf_counter(), thread_times()
    for iteration in range(args.iters):
        if iteration == args.warmup:
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            threads = thread_times()
        step(iteration)
    if cuda:
        torch.cuda.synchronize()
    timed = max(args.iters - args.warmup, 1)
    elapsed, after = time.perf_counter() - started, thread_times()
    busy = gpu_busy(step, args.traced) if cuda and args.traced else None
    if dist.get_rank() == 0:
        print(f"iter-ms {elapsed * 1e3 / timed:.3f}", flush=True)
        print("\n".join(sched_lines(threads, after, timed)), flush=True)
        if busy:
            print(busy, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
