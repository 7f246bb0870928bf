"""Where a rank's main thread is, sampled for the heartbeat: the WHERE column, the live stack, stall verdicts.

Read on ddptop's sender thread, once a heartbeat, from the main thread's
current frame (sys._current_frames): the training thread does nothing for
it. One bounded walk of the frames gives everything the supervisor asks:

- `where`, the innermost frame of the script's own code ("train.py:51 in
  train_step"), else the innermost Python frame: what the WHERE column shows;
- `inside`, the torch.distributed call the main thread is in ("all_reduce",
  "barrier"), so a rank that waits for the others says so;
- `checkpoint`, whether it is saving or loading a checkpoint (torch.save or
  load, torch.distributed.checkpoint, safetensors, whoever calls them), so a
  rank writing one to slow storage is not said to be waiting for data;
- `joined`, whether it has run out of data under DDP's `Join` and shadows the
  others' collectives until they have too, so its state says so rather than
  that it waits for its next batch;
- `model`, whether a module in eval mode is being called (nn.Module's call),
  outside the DataLoader's code: between two steps, an evaluation that no DDP
  forward marks (rank 0 evaluating through `model.module`, an EMA copy of the
  model), and not a transform in train mode (torchvision's are modules) or a
  frozen encoder a dataset calls while it loads;
- `stack`, the main thread's frames, outermost first: sent when it changed
  since the last heartbeat, so the supervisor calls a rank working while it
  moves and stuck while it stays, and a stuck rank's heartbeats stay small.

No failure here may reach the rank.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from types import FrameType

from ddptop.core.places import is_script, is_template, stack_line

MAX_DEPTH = 200
"""Frames walked at most: deep recursion costs the sender thread no more than this."""

STACK_FRAMES = 48
"""Frames of the main thread's stack sent at most, the innermost ones."""

NATIVE = "in native code"
"""The main thread has no Python frame (inside C code before any Python ran, or gone)."""

COLLECTIVES_FILE = "/torch/distributed/distributed_c10d.py"
"""Where torch.distributed's collectives (all_reduce, barrier, broadcast...) are defined."""

MODULE_FILE = "/torch/nn/modules/module.py"
"""Where nn.Module's call runs a forward (and its hooks)."""

MODULE_CALLS = frozenset({"_call_impl", "_wrapped_call_impl"})
"""nn.Module's call, whose `self` is the module called."""

DATA_CODE = "/torch/utils/data/"
"""torch's DataLoader and datasets: a module called under them is part of loading a batch."""

CHECKPOINT_CODE = ("/torch/serialization.py", "/torch/distributed/checkpoint/", "/safetensors/")
"""Where checkpoints are written and read, by whichever library a script saves with: Lightning,
Hugging Face and ddptop's own monitor.checkpoint call into one of these."""

JOIN_FILE = "/torch/distributed/algorithms/join.py"
"""DDP's Join context manager, whose exit a rank out of data sits in while the others train on.
Its exit alone: every DDP forward under it calls its notify_join_context, training."""


@dataclass(frozen=True, slots=True)
class Sample:
    where: str
    inside: str | None
    stack: tuple[str, ...]
    checkpoint: bool = False
    model: bool = False
    joined: bool = False


NOWHERE = Sample(NATIVE, None, ())


class Phase:
    """The phase heartbeats tell: the one the hooks tracked, unless the main thread's stack says
    more. Inside a checkpoint's save or load, "checkpoint"; calling a module in eval mode after a
    step ended ("data": no training forward has begun the next), "eval", and "eval" until that
    forward: an evaluation's own lines between its forwards (making the next batch, a metric)
    call no module, and a look that lands on one must not call the rank back to loading data."""

    def __init__(self) -> None:
        self._evaluating: int | None = None
        """The step whose wait for its first forward an evaluation was seen in."""

    def of(self, sample: Sample, tracked: str, step: int) -> str:
        if sample.checkpoint:
            self._evaluating = None
            return "checkpoint"
        if sample.joined:
            self._evaluating = None
            return "joined"
        if tracked != "data":
            self._evaluating = None
            return tracked
        if sample.model:
            self._evaluating = step
        return "eval" if self._evaluating == step else tracked


def sample() -> Sample:
    """The main thread's place, as of now; NOWHERE rather than an exception on the sender thread."""
    try:
        return _walk()
    except Exception:  # noqa: BLE001 - a frame the walk cannot read must not end the heartbeats
        return NOWHERE


def _walk() -> Sample:
    frame: FrameType | None = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return NOWHERE
    script: str | None = None
    inside: str | None = None
    checkpoint = loading = joined = False
    called: FrameType | None = None  # the outermost frame of nn.Module's call: the module the script called
    stack: list[str] = []
    for _ in range(MAX_DEPTH):
        if frame is None:
            break
        code = frame.f_code
        path = code.co_filename
        if is_template(path):
            break
        text = stack_line(path, frame.f_lineno, code.co_name)
        if script is None and is_script(path):
            script = text
        elif inside is None and path.endswith(COLLECTIVES_FILE):
            inside = code.co_name
        elif code.co_name in MODULE_CALLS and path.endswith(MODULE_FILE):
            called = frame
        elif DATA_CODE in path:
            loading = True
        elif not checkpoint and any(part in path for part in CHECKPOINT_CODE):
            checkpoint = True
        elif path.endswith(JOIN_FILE) and code.co_name == "__exit__":
            joined = True
        if len(stack) < STACK_FRAMES:
            stack.append(text)
        frame = frame.f_back
    stack.reverse()
    # One look at one frame's locals a heartbeat: the module's mode, which model.eval() set.
    model = called is not None and not loading and getattr(called.f_locals.get("self"), "training", True) is False
    return Sample(script or stack[-1], inside, tuple(stack), checkpoint, model, joined)
