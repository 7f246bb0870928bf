"""A PyTorch Lightning job as its docs teach it, run by torchrun (Lightning joins the ranks torchrun
made): a LightningModule over token ids, DDP, gradient accumulation. ddptop is never mentioned.

Each micro-batch prints `[micro] GLOBAL_STEP LOSS` (the loss training_step returns, before
Lightning divides it by the accumulation for backward), so a test can compare ddptop's loss.
With --val-every N, Lightning validates every N training batches, as its docs' val_check_interval.
With --fsdp2 the model is sharded instead, as Lightning's docs teach for FSDP2: the
ModelParallelStrategy's device mesh, fully_shard on each layer and then on the module in
configure_model; each step then prints `[norm] GLOBAL_STEP NORM`, the norm of its gradients
gathered whole before the optimizer steps.
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=12)
parser.add_argument("--accumulate", type=int, default=2)
parser.add_argument("--val-every", type=int, default=0)
parser.add_argument("--fsdp2", action="store_true")
args = parser.parse_args()


class Tokens(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randint(0, 50, (17,), generator=torch.Generator().manual_seed(index))


class TinyLM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.head = nn.Linear(32, 50)

    def configure_model(self) -> None:
        if args.fsdp2:
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            fully_shard(self.embed, mesh=mesh)
            fully_shard(self.head, mesh=mesh)
            fully_shard(self, mesh=mesh)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(idx))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        idx, targets = batch[:, :-1], batch[:, 1:]
        logits = self(idx)
        loss = F.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1))
        self.log("train_loss", loss)
        print(f"[micro] {self.global_step} {loss.item()!r}", flush=True)
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        idx, targets = batch[:, :-1], batch[:, 1:]
        self.log("val_loss", F.cross_entropy(self(idx).reshape(-1, 50), targets.reshape(-1)), sync_dist=True)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if args.fsdp2:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.full_tensor().norm() for p in self.parameters()]))
            print(f"[norm] {self.global_step} {norm.item()!r}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    strategy = "ddp"
    if args.fsdp2:
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=args.max_steps,
        accumulate_grad_batches=args.accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=args.val_every or None,
        limit_val_batches=2 if args.val_every else 0,
        num_sanity_val_steps=0,
    )
    trainer.fit(TinyLM(), DataLoader(Tokens(), batch_size=8), DataLoader(Tokens(), batch_size=8) if args.val_every else None)
