"""bench/gpt_train.py's loop as one of bench/inrank.py's jobs (`--model gpt`).

nanogpt.py times that loop as whole jobs, plain torchrun against ddptop,
one after the other: on a GPU host the same plain job moves by a third
from one round to the next (docs/benchmarks.md), far more than the 1% it
is asked to resolve. As inrank.py's jobs, a plain copy of the loop and an
instrumented one alternate in blocks of steps in one process, on one
device, so the host's drift falls on both alike.

The step is gpt_train's: bf16 autocast, a GradScaler enabled only for
fp16 (so, here, none), the script's own `clip_grad_norm_(1.0)` over all
parameters, torch's fused AdamW on a GPU, the loss read on the host every
10 iterations.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpt_train import LOSS_READ_EVERY, batch, loss_of, make, train_step

LINES = ("next batch", "model(x)", "loss.backward()", "clip_grad_norm_", "optimizer.step()", "zero_grad, loss read")
"""The lines of the step --lines times, as GptJob.run_lines splits it."""


class GptJob:
    """One copy of gpt_train's loop: model, optimizer, scaler, random tokens."""

    LINES = LINES

    def __init__(self, args: argparse.Namespace, torch_device: Any) -> None:
        import torch

        torch.manual_seed(0)
        self.device = torch_device
        self.batch_size, self.context = args.batch_size, args.context
        self.model, self.optimizer, self.scaler = make(
            torch_device, args.context, args.layers, args.width, args.heads, bucket_view=args.bucket_view
        )
        self.iteration = 0

    def tokens(self) -> Any:
        """A batch of random token ids on the job's device."""
        return batch(self.batch_size, self.context, self.device)

    def one_loss(self) -> Any:
        """A forward's loss, with its graph."""
        return loss_of(self.model, self.tokens())

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.iteration += 1
            train_step(self.model, self.optimizer, self.scaler, self.tokens(), self.iteration)

    def run_lines(self, steps: int, took: dict[str, list[float]]) -> None:
        """run(), its train_step's lines written out, each line's wall time added to took[line]
        (bench/inrank.py --lines)."""
        import torch

        clock = time.perf_counter
        for _ in range(steps):
            t0 = clock()
            ids = self.tokens()
            t1 = clock()
            loss = loss_of(self.model, ids)
            t2 = clock()
            self.scaler.scale(loss).backward()
            t3 = clock()
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            t4 = clock()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            t5 = clock()
            self.optimizer.zero_grad(set_to_none=True)
            self.iteration += 1
            if self.iteration % LOSS_READ_EVERY == 0:
                loss.item()
            t6 = clock()
            for line, start, end in zip(LINES, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6)):
                took[line].append(end - start)
