"""A PyTorch Lightning job that shards its model as Lightning's docs teach for FSDP2: the
ModelParallelStrategy's device mesh, fully_shard on each block and then on the module in
configure_model, run by torchrun. ddptop is never mentioned.

Each rank prints, per step, the loss training_step returns and the norm of its gradients
gathered whole before the optimizer steps, as `[loss] STEP VALUE` and `[norm] STEP VALUE`.
"""

import argparse

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=12)
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
        self.blocks = nn.ModuleList(nn.Linear(32, 32) for _ in range(2))
        self.head = nn.Linear(32, 50)

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for block in self.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = x + torch.relu(block(x))
        return self.head(x)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch[:, :-1]).reshape(-1, 50), batch[:, 1:].reshape(-1))
        print(f"[loss] {self.global_step} {loss.item()!r}", flush=True)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        norm = torch.linalg.vector_norm(torch.stack([p.grad.full_tensor().norm() for p in self.parameters()]))
        print(f"[norm] {self.global_step} {norm.item()!r}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyLM(), DataLoader(Tokens(), batch_size=8))
