"""One process driving every GPU with nn.DataParallel, as a first tutorial does.
No torch.distributed at all; on a machine without a GPU it runs on the CPU.
--nan-at STEP makes that step's loss NaN."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--nan-at", type=int, default=-1)
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
if torch.cuda.device_count() > 1:
    print(f"Let's use {torch.cuda.device_count()} GPUs!")
model = nn.DataParallel(model).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    x, y = torch.randn(32, 16, device=device), torch.randn(32, 1, device=device)
    loss = nn.functional.mse_loss(model(x), y)
    if step == args.nan_at:
        loss = loss * float("nan")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("final", sum(p.sum().item() for p in model.parameters()))
