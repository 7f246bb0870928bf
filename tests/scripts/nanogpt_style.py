"""nanoGPT's training loop, shrunk: gradient accumulation with require_backward_grad_sync toggled,
a GradScaler, token ids in, the loss divided by the accumulation steps. ddptop is never mentioned.

Each rank prints, per optimizer step, the sum of the (scaled-down) micro-step losses it called
backward() on, `[lossum] STEP VALUE`, so a test can compare ddptop's zero-code loss with it, and the
norm its clip_grad_norm_ returned (after unscale_, before clipping), `[gradnorm] STEP VALUE`.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--max-iters", type=int, default=30)
parser.add_argument("--gradient-accumulation-steps", type=int, default=4)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--block-size", type=int, default=16)
parser.add_argument("--vocab-size", type=int, default=64)
args = parser.parse_args()


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, width: int = 32) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        logits = self.lm_head(x + self.mlp(x))
        loss = None if targets is None else F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def get_batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size + 1), generator=generator)
    return data[:, :-1], data[:, 1:]


def main() -> None:
    dist.init_process_group(backend="gloo")
    ddp_rank = int(os.environ["RANK"])
    torch.manual_seed(1337)
    generator = torch.Generator().manual_seed(1337 + ddp_rank)
    model = DDP(TinyGPT(args.vocab_size, args.block_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=True, init_scale=1024.0)
    X, Y = get_batch(generator)
    for iter_num in range(args.max_iters):
        summed = 0.0
        for micro_step in range(args.gradient_accumulation_steps):
            model.require_backward_grad_sync = micro_step == args.gradient_accumulation_steps - 1
            _, loss = model(X, Y)
            loss = loss / args.gradient_accumulation_steps
            summed += loss.item()
            X, Y = get_batch(generator)
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        print(f"[lossum] {iter_num} {summed!r}", flush=True)
        print(f"[gradnorm] {iter_num} {float(norm)!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
