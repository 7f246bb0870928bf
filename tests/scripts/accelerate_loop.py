"""A custom training loop as Hugging Face Accelerate's examples write one: prepare(),
accumulate() over 2 micro-batches, accelerator.backward(), accelerator.clip_grad_norm_ on the
step that syncs, a scheduler prepared with the optimizer. ddptop is never mentioned.

Accelerate's optimizer wrapper calls the inner optimizer's step() only on the micro-batch that
syncs, and accelerator.backward() divides each loss by the accumulation steps. Each rank prints,
per optimizer step, the sum of the divided losses it called backward() on, the norm
clip_grad_norm_ returned and the learning rate the step used, as `[loss] STEP VALUE`, `[norm]
STEP VALUE` and `[lr] STEP VALUE`, so a test can compare what ddptop shows with them.
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ACCUMULATE = 2
BATCH = 16

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=1024)
args = parser.parse_args()

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
set_seed(0)
x = torch.randn(args.samples, 32)
y = (x.sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / 1000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
step, loss_sum = 0, 0.0
for inputs, labels in loader:
    with accelerator.accumulate(model):
        loss = nn.functional.cross_entropy(model(inputs), labels)
        accelerator.backward(loss)
        loss_sum += loss.item() / ACCUMULATE
        if accelerator.sync_gradients:
            norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
            lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    if accelerator.sync_gradients:
        print(f"[loss] {step} {loss_sum!r}\n[norm] {step} {float(norm)!r}\n[lr] {step} {lr!r}", flush=True)
        step, loss_sum = step + 1, 0.0
accelerator.end_training()
