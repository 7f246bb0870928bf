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
from types import CodeType, FrameType

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
    codes: frozenset[CodeType] = frozenset()
    """The code of every frame walked: whether a function is still running."""
    caller: CodeType | None = None
    """Where `model` is, the script's function that called the module."""


NOWHERE = Sample(NATIVE, None, ())


class Phase:
    """The phase heartbeats tell: the one the hooks tracked, unless the main thread's stack says
    more. Inside a checkpoint's save or load, "checkpoint"; calling a module in eval mode after a
    step ended ("data": no training forward has begun the next), "eval". An evaluation lasts as
    long as the script's function that ran its forwards (`validate`), not to the next training
    forward: its own lines between its forwards (making the next batch, a metric) call no module,
    and once that function has returned the rank is no longer evaluating (the script's end, a
    save after its last validation)."""

    def __init__(self) -> None:
        self._evaluating: tuple[int, CodeType | None] | None = None
        """The step whose wait for its first forward an evaluation was seen in, and the function running it."""

    def of(self, sample: Sample, tracked: str, step: int, evaluating_in: CodeType | None = None) -> str:
        """evaluating_in: where the hooks saw the evaluation (tracked "eval") begin, as
        StepTracker.eval_code has it."""
        if sample.checkpoint:
            self._evaluating = None
            return "checkpoint"
        if sample.joined:
            self._evaluating = None
            return "joined"
        if tracked == "eval":
            return "eval" if evaluating_in is None or evaluating_in in sample.codes else "data"
        if tracked != "data":
            self._evaluating = None
            return tracked
        if sample.model:
            self._evaluating = (step, sample.caller)
        seen = self._evaluating
        if seen is not None and seen[0] == step and (seen[1] is None or seen[1] in sample.codes):
            return "eval"
        return tracked


def script_caller() -> CodeType | None:
    """The code of the innermost frame of the script's own code on the calling thread: in a
    module's hook, the function that called the module."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(MAX_DEPTH):
        if frame is None:
            break
        if is_script(frame.f_code.co_filename):
            return frame.f_code
        frame = frame.f_back
    return None


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
    caller: CodeType | None = None  # the script's frame outside it
    codes: set[CodeType] = set()
    stack: list[str] = []
    for _ in range(MAX_DEPTH):
        if frame is None:
            break
        code = frame.f_code
        path = code.co_filename
        if is_template(path):
            break
        text = stack_line(path, frame.f_lineno, code.co_name)
        codes.add(code)
        if is_script(path) and caller is None and called is not None:
            caller = code
        if script is None and is_script(path):
            script = text
        elif inside is None and path.endswith(COLLECTIVES_FILE):
            inside = code.co_name
        elif code.co_name in MODULE_CALLS and path.endswith(MODULE_FILE):
            called, caller = frame, None
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
    return Sample(script or stack[-1], inside, tuple(stack), checkpoint, model, joined, frozenset(codes), caller if model else None)
