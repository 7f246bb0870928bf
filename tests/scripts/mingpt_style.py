"""minGPT-ddp's Trainer, shrunk: mixed precision with a GradScaler whose clipping runs on the
scaled gradients (no unscale_), AdamW, and a snapshot.pt that rank 0 saves every few steps and
that every start resumes from, model, optimizer and step. ddptop is never mentioned.

Each rank prints, per step, the unscaled pre-clip norm its own clip_grad_norm_ saw
(`[prenorm] STEP VALUE`: what it returned over the scaler's scale), so a test can compare
ddptop's GRAD NORM with it. `--die-at STEP` makes rank 1 SIGKILL itself at that step, once (a
marker beside the snapshot remembers), as the OOM killer would.
"""

import argparse
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=40)
parser.add_argument("--save-every", type=int, default=10)
parser.add_argument("--snapshot", type=Path, default=Path("snapshot.pt"))
parser.add_argument("--die-at", type=int, default=-1)
parser.add_argument("--vocab-size", type=int, default=64)
parser.add_argument("--block-size", type=int, default=16)
args = parser.parse_args()


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, width: int = 32) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Parameter(torch.zeros(1, block, width))
        self.block = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.tok_emb(idx) + self.pos_emb[:, : idx.size(1)]
        logits = self.head(x + self.block(x))
        return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class Trainer:
    def __init__(self, model: nn.Module) -> None:
        self.rank = int(os.environ["LOCAL_RANK"])
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        self.steps_run = 0
        if args.snapshot.exists():
            self._load_snapshot()
        self.model = DDP(self.model)

    def _load_snapshot(self) -> None:
        snapshot = torch.load(args.snapshot, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.steps_run = snapshot["STEPS_RUN"]
        print(f"Resuming training from snapshot at step {self.steps_run}", flush=True)

    def _save_snapshot(self, step: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "OPTIMIZER_STATE": self.optimizer.state_dict(), "STEPS_RUN": step + 1}
        torch.save(snapshot, f"{args.snapshot}.tmp")
        os.replace(f"{args.snapshot}.tmp", args.snapshot)

    def _run_batch(self, step: int, source: torch.Tensor, targets: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = self.model(source, targets)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        print(f"[prenorm] {step} {float(norm) / self.scaler.get_scale()!r}", flush=True)
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def train(self) -> None:
        generator = torch.Generator().manual_seed(1000 + self.rank)
        marker = Path(f"{args.snapshot}.died")
        for step in range(self.steps_run, args.max_steps):
            if step == args.die_at and self.rank == 1 and not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            data = torch.randint(0, args.vocab_size, (8, args.block_size + 1), generator=generator)
            self._run_batch(step, data[:, :-1], data[:, 1:])
            if self.rank == 0 and (step + 1) % args.save_every == 0:
                self._save_snapshot(step)


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    Trainer(TinyGPT(args.vocab_size, args.block_size)).train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
