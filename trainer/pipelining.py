"""torch.distributed.pipelining's schedules: a step's loss is the mean of its micro-batches',
and a stage's first forward, which learns its shapes, is no batch.

A pipeline schedule calls backward() on the last stage's loss of each
micro-batch, which the backward() wrapper takes as the step's losses
(hooks.py) and the guard sums, as it sums an accumulating script's. An
accumulating script divides each by the micro-batches itself; a schedule
leaves each whole and divides the gradients instead, once all backward
passes are done (`scale_grads`, by the micro-batches, unless the script's
loss function sums and it was built with scale_grads=False). The step's
loss is then their sum divided by the same factor: the wrapper tells the
guard (PipelineStep.loss_divisor), at no cost to any other job.

At its first step a stage runs its module once more, on empty tensors of
the batch's shapes, to learn the shapes it sends (torchapi.PIPELINE_SHAPES):
while it does, the sharded module's forward hook counts nothing
(PipelineStep.inferring_shapes, sharded_forward.py).

Imported only once the script has imported torch (hooks.py); the stage's
classes are wrapped once their module is imported, never importing it.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from ddptop.trainer import importwatch, patches, torchapi
from ddptop.trainer.probe import Probe


def install(probe: Probe) -> None:
    importwatch.after_import(torchapi.PIPELINE_STAGE_MODULE, functools.partial(_wrap_stage, probe))


def _wrap_stage(probe: Probe) -> None:
    module = sys.modules[torchapi.PIPELINE_STAGE_MODULE]
    base, shapes = torchapi.pipeline_stage(module)
    original = getattr(base, "scale_grads", None)
    if original is not None:

        @functools.wraps(original)
        def scale_grads(self: Any, grad_scale_factor: int) -> None:
            original(self, grad_scale_factor)
            if grad_scale_factor != 1:
                probe.pipeline.loss_divisor = grad_scale_factor

        patches.replace(base, "scale_grads", scale_grads)
    if shapes is not None:
        patches.replace(module.PipelineStage, shapes, _no_batch(getattr(module.PipelineStage, shapes), probe))


def _no_batch(infer: Any, probe: Probe) -> Any:
    @functools.wraps(infer)
    def inferring(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe.pipeline.inferring_shapes = True
        try:
            return infer(self, *args, **kwargs)
        finally:
            probe.pipeline.inferring_shapes = False

    return inferring
