"""Forwards between a DDP step's end and the next training forward: an evaluation, or part of the next step.

A DDP model's own forwards are seen by its class's wrapper (hooks.py). A
script may also evaluate through the module DDP wraps (`model.module`), an
EMA copy, or a task object holding the module, and none of those passes
through DDP. Without this, that evaluation would count as the next step's
data wait.

One global forward pre-hook is armed as a DDP step ends and disarmed as the
next training forward begins, before nn.Module's call looks for hooks. So
training pays a dictionary store and pop a step, and no module call takes
the slow path. The first module called in that gap is watched until the
gap ends. Its forwards are an evaluation when it is (or holds) the module a
DDP model wraps, or when it runs more than once (an evaluation's batches).
One forward of another model is the next step's preparation (a frozen VAE
encoding the batch, a teacher's targets) and stays in its data wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from ddptop.trainer import torchapi
from ddptop.trainer.steps import StepTracker


class BetweenSteps:
    def __init__(self, tracker: StepTracker, wrapped: Callable[[], Iterable[Any]], clock: Callable[[], float] = time.perf_counter) -> None:
        self.tracker = tracker
        self._wrapped = wrapped
        """The modules the rank's DDP models wrap, as of now."""
        self._clock = clock
        self.hooks: dict[int, Callable[..., Any]] = torchapi.global_forward_pre_hooks
        """nn.Module's global forward pre-hooks, which every module call looks at."""
        self.key = RemovableHandle(self.hooks).id
        """This hook's key among them."""
        self.watched: _Watched | None = None
        """The module first called since the step ended, while the gap lasts."""

    def arm(self) -> None:
        """A DDP step ended: the next module call that is not a DDP model's is looked at."""
        self.hooks[self.key] = self.first

    def settle(self) -> None:
        """The gap is over (a training forward begins): stop watching. What was an evaluation
        is in the tracker already (evaluating, evaluated)."""
        self.hooks.pop(self.key, None)
        if self.watched is not None:
            self.watched.release()
            self.watched = None

    def first(self, module: Any, args: Any) -> None:
        """The first module call since the step ended: a training forward of another kind (a
        compiled DDP model's wrapper) ends the look; anything else is watched."""
        self.hooks.pop(self.key, None)  # nn.Module's call iterates a copy of the hooks
        if module.training and torch.is_grad_enabled():
            return
        began = self._clock()
        holds = any(module is inner or any(child is inner for child in module.children()) for inner in self._wrapped())
        self.watched = _Watched(module, self, began, holds)
        if holds:
            self.tracker.evaluating(began)


class _Watched:
    """One module's forwards in one gap, and whether they are an evaluation's yet."""

    def __init__(self, module: Any, owner: BetweenSteps, began: float, evaluation: bool) -> None:
        self.owner = owner
        self.began = began
        self.evaluation = evaluation
        self.handles = (module.register_forward_pre_hook(self._again), module.register_forward_hook(self._returned))

    def _again(self, module: Any, args: Any) -> None:
        if not self.evaluation:  # a second forward in one gap: an evaluation's batches, from the first
            self.evaluation = True
            self.owner.tracker.evaluating(self.began)

    def _returned(self, module: Any, args: Any, output: Any) -> None:
        if self.evaluation:
            self.owner.tracker.evaluated()

    def release(self) -> None:
        for handle in self.handles:
            handle.remove()
