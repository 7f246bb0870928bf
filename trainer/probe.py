"""What one rank's torch hooks share (hooks.py, optimizer_step.py): where records
go, the guard's policy, the DDP models, and what the step so far told them.

This module imports torch at the top: it is only reached from hooks.py,
once the script's own `import torch` has finished (runtime.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

from ddptop.core.policy import GuardPolicy
from ddptop.trainer import guard, shard_share
from ddptop.trainer.between_steps import BetweenSteps
from ddptop.trainer.profiling import Captures
from ddptop.trainer.sampled import Sampled
from ddptop.trainer.steps import StepTracker


class Gradients(NamedTuple):
    """What the guard found of one optimizer's gradients, for one count of them (Probe.gradients)."""

    sharded: bool
    """Whether any of them is sharded over ranks (a DTensor)."""
    several_devices: bool
    """Whether they are on several devices (a model split over GPUs)."""
    flat: guard.Flat | None
    """The flat buffers they lie in (DDP's buckets under gradient_as_bucket_view), or None."""
    roots: tuple[weakref.ref[Any], ...] = ()
    """The FSDP1 roots whose sharded parameters they are the gradients of (fsdp1.py), weakly."""
    dtensors: tuple[bool, ...] = ()
    """Which of them are DTensors, in order (guard.dtensors)."""
    weights: shard_share.Weights | None = None
    """Of DTensor gradients, each one's weight in the rank's share of the grad norm's square."""
    own: tuple[bool, ...] = ()
    """Which of them are the rank's own (Probe.rank_own), in order; none where fully_shard ignored
    no parameter."""


class ScalerSeen:
    """What a GradScaler did this step (hooks._wrap_grad_scaler): the loss the guard packs is read unscaled."""

    def __init__(self) -> None:
        self.scale: torch.Tensor | None = None
        """The scale a GradScaler multiplied this step's loss by (None: no scaler, or a disabled one)."""
        self.unscaled = False
        """Whether GradScaler.unscale_ ran since that scale(): the gradients are unscaled."""
        self.scaled_at: list[int] = []
        """Which of the step's losses (tracker.losses, by position) a GradScaler scaled."""
        self.scaled: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        """Tensors a GradScaler scaled, by id, with the id of the tensor they were scaled from
        (the latest SCALED_KEPT kept): the loss that goes to backward() is read unscaled, and
        monitor.step(loss=) of the unscaled one is known to be the same loss."""


class ScriptClip:
    """The script's own clip_grad_norm_ this step (hooks._clip): its norm is the step's, where it measured every gradient."""

    def __init__(self) -> None:
        self.script_norm: tuple[torch.Tensor, bool] | None = None
        """What the script's clip_grad_norm_ returned this step, and whether the gradients it
        measured were still scaled; two calls in one step leave None (their norms are parts)."""
        self.clips = 0
        self.clipped: list[Any] = []
        """The parameters the script's clip_grad_norm_ was given this step (not held past it)."""
        self.covers: dict[tuple[int, ...], bool] = {}
        """Whether a script's clip covered every gradient an optimizer steps, by (optimizer, gradients,
        parameters clipped, first and last of them): found once, then looked up without a call."""


class FusedSkip:
    """A non-finite step skipped on the device: the found_inf ddptop hands a fused optimizer (optimizer_step._guard)."""

    def __init__(self) -> None:
        self.inf_flag: torch.Tensor | None = None
        """The found_inf ddptop hands a fused optimizer, made once and written on the device each step."""
        self.found_inf_set: Any = None
        """The optimizer ddptop handed a found_inf to for the step running (taken back after it)."""


class PipelineStep:
    """What a pipeline schedule's step tells the guard (pipelining.py)."""

    def __init__(self) -> None:
        self.inferring_shapes = False
        """Whether a pipeline stage runs its module to learn its shapes (pipelining.py): no batch."""
        self.loss_divisor = 1
        """What a pipeline schedule divided this step's gradients by (pipelining.py): the step's
        loss is its micro-batches' losses summed, divided by it. Taken by the guard."""


class Probe:
    """What the hooks of one rank share: where records go, the policy, the DDP
    models (for checksums and DDP's own timings), and what the step so far told."""

    def __init__(self, tracker: StepTracker, policy: GuardPolicy, sampled: Sampled | None = None, captures: Captures | None = None) -> None:
        self.tracker = tracker
        self.captures = captures if captures is not None else Captures(tracker.rank, 0, lambda record: None)
        """Profiler captures asked of this rank (profiling.py): run at step boundaries."""
        self.captures.models = self.ddp_models
        self.policy = policy
        self.skips = policy.skips
        """policy.skips, read once: an attribute costs the step no call."""
        self.waits_on_gpu = policy.waits(cuda=True)
        """policy.waits on a GPU, read once, as skips is."""
        self.sampled = sampled if sampled is not None else Sampled()
        self.captures.hold_rate = self.sampled.hold_rate
        self.models: list[weakref.ref[Any]] = []
        """The DDP models, weakly: their parameters are what the checksum covers."""
        self.world = 1
        """The DDP models' group size: at 1 a non-finite gradient is this rank's own."""
        self.groups: dict[int, Any] = {}
        """The DDP models' process groups, held to the rank's end and past it (keep_groups says why)."""
        self.gradients: dict[tuple[int, int], Gradients] = {}
        """What the guard found of an optimizer's gradients, by optimizer id and how many of them
        a step has: found at the first step with that count, then looked up without a call. By
        count too, since a script may step a different set each step (find_unused_parameters
        with a layer used every other step): each set keeps its own."""
        self.watched: set[int] = set()
        """The optimizers (by id) whose end lets go of their entries in gradients: watched once each."""
        self.resume_seen = False
        """Whether the first optimizer step has looked for a script's own resume (once a process)."""
        self.stepping: Any = None
        """The optimizer whose step() is running. One that raised is left
        here, and its next step() begins afresh."""
        self.cuda = False
        """Whether the latest step's gradients were on a GPU."""
        self.scaler = ScalerSeen()
        self.clip = ScriptClip()
        self.fused = FusedSkip()
        self.pipeline = PipelineStep()
        self.fsdp1: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[Any]]] = {}
        """The parameters FSDP1 shards over ranks, by id, each with its outermost FSDP1 module
        (fsdp1.py): held weakly, and checked to be the same tensor when looked up."""
        self.ignored: dict[int, weakref.ref[torch.Tensor]] = {}
        """The parameters fully_shard was told to ignore, by id, held weakly: FSDP neither shards
        them nor reduces their gradients, and the script may keep a different one on each rank
        (an expert of its own): no rank's is compared with another's."""
        self.fsdp1_norm: Callable[[Any], torch.Tensor] = lambda root: torch.zeros(())
        """An FSDP1 root's global grad norm over its ranks (fsdp1.py), for --clip-grad."""
        self.between = BetweenSteps(tracker, self.wrapped_modules)
        """The look for an evaluation that passes by DDP, between a DDP step and the next."""
        self.notice: Callable[[str], None] = lambda text: None
        """Where a one-time notice goes (the supervisor's alert panel, through the tracker)."""
        self.noticed: set[str] = set()

    def data_parallel_over(self, ranks: Iterable[int]) -> None:
        """A model of this rank is data-parallel over these ranks alone, part of the job: DDP's
        process group of a pipeline stage's or a tensor-parallel shard's replicas, or the mesh
        FSDP shards over beside tensor parallelism. The ranks of the other stages or shards
        see the same samples and do other work (StepTracker.replicas). Several models: the
        ranks they share."""
        ranks = tuple(sorted(ranks))
        known = self.tracker.replicas
        self.tracker.replicas = ranks if known is None else tuple(r for r in known if r in ranks)

    def batch_shared_by(self, ranks: int) -> None:
        """Tensor parallelism alone splits a model of this rank over these many ranks, the whole
        job: each is given the same batch, and does a share of the work on it."""
        self.tracker.batch_shared = max(self.tracker.batch_shared, ranks)

    def ddp_models(self) -> list[Any]:
        return [model for ref in self.models if (model := ref()) is not None]

    def wrapped_modules(self) -> list[Any]:
        """The modules the DDP models wrap."""
        return [model._modules["module"] for model in self.ddp_models()]

    def parameters(self) -> list[torch.Tensor]:
        """The DDP models' parameters that DDP keeps alike on every rank: not those the script
        told it to ignore (DistributedDataParallel._set_params_and_buffers_to_ignore_for_model:
        TorchRec's embedding tables, sharded over the ranks beside a DDP of the dense layers)."""
        found: list[torch.Tensor] = []
        for module in self.wrapped_modules():
            ignored = getattr(module, "_ddp_params_and_buffers_to_ignore", None)
            found += module.parameters() if not ignored else (p for name, p in module.named_parameters() if name not in ignored)
        return found

    def fsdp1_roots(self, optimizer: Any) -> tuple[weakref.ref[Any], ...]:
        """The FSDP1 roots that shard the parameters optimizer steps this step, weakly; none for
        parameters FSDP1 does not shard. Asked once for each optimizer and count of gradients."""
        roots: dict[int, weakref.ref[Any]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                root = self.fsdp1_root(param) if param.grad is not None else None
                if root is not None and (module := root()) is not None:
                    roots[id(module)] = root
        return tuple(roots.values())

    def fsdp1_root(self, tensor: torch.Tensor) -> weakref.ref[Any] | None:
        """The outermost FSDP1 module, weakly, of tensor if it is a parameter FSDP1 shards over
        ranks (each rank holds a different part); None for any other tensor."""
        entry = self.fsdp1.get(id(tensor))
        return entry[1] if entry is not None and entry[0]() is tensor else None

    def ignore(self, parameters: Iterable[torch.Tensor]) -> None:
        """fully_shard was told to leave these parameters to the script (its ignored_params)."""
        self.ignored.update((id(p), weakref.ref(p)) for p in parameters)

    def is_ignored(self, tensor: torch.Tensor) -> bool:
        """Whether tensor is a parameter fully_shard ignored (the id checked to be the same tensor)."""
        ref = self.ignored.get(id(tensor))
        return ref is not None and ref() is tensor

    def rank_own(self, optimizer: Any) -> tuple[bool, ...]:
        """For each gradient optimizer steps this step, in its order, whether its parameter is
        one fully_shard ignored: the rank's own, no other rank's piece. Asked once for each
        optimizer and count of gradients."""
        return tuple(self.is_ignored(p) for group in optimizer.param_groups for p in group["params"] if p.grad is not None)

    def comparable(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """tensors less the parameters fully_shard ignored and FSDP1 shards, which ranks need not
        hold alike: what a desync checksum may compare."""
        if self.ignored:
            tensors = [t for t in tensors if not self.is_ignored(t)]
        if self.fsdp1:
            tensors = [t for t in tensors if self.fsdp1_root(t) is None]
        return tensors

    def tell_once(self, key: str, text: str) -> None:
        if key not in self.noticed:
            self.noticed.add(key)
            self.notice(text)


SCALED_KEPT = 16
"""How many tensors a GradScaler scaled a probe remembers (Probe.scaled)."""
