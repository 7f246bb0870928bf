"""The private parts of torch that ddptop uses, in one place, checked against the running torch.

torch has no public way to do a few things ddptop must: read the scale a
GradScaler multiplied the loss by (`_scale`), take a norm over many tensors
in one kernel (`_foreach_norm`, what clip_grad_norm_ itself calls), read
what DDP's reducer measured (`_get_ddp_logging_data`), dump the flight
recorders (`_dump_fr_trace`, and NCCL's own `_dump_nccl_trace`), tell a
backward run inside another (`_current_graph_task_id`), read a sparse
gradient's values uncoalesced (`_values`), look up a device's current stream
without building a Python object (`_cuda_getCurrentStream`), keep torch.compile out of its
hooks (dynamo's `trace_rules`), know a pipeline stage's step (`_PipelineStageBase`, and the
run of its module that learns its shapes), wrap DDP's call before it looks for hooks (nn.Module's
`_call_impl`) and arm one hook without making a handle each step (`_global_forward_pre_hooks`). Every such name is used through this module,
and `missing()` says which of them the running torch lacks:
tests/test_hooks.py runs it against the installed torch, and CI runs the
fast set on the oldest torch the package declares.

Imported only once the script has imported torch (hooks.py, optimizer_step.py, guard.py).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

foreach_norm: Callable[..., Any] = torch._foreach_norm
foreach_mul_: Callable[..., Any] = torch._foreach_mul_
set_grad_enabled: Callable[[bool], None] = torch._C._set_grad_enabled
"""Grad mode on or off with no context manager around it (a Python call fewer a step)."""
sparse_values: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor._values
"""A sparse COO tensor's values as they are, coalesced or not (values() insists on coalesced)."""
current_graph_task_id: Callable[[], int] = torch._C._current_graph_task_id
"""The backward running on this thread, -1 outside one: a backward() called inside another."""
global_forward_pre_hooks: dict[int, Callable[..., Any]] = torch.nn.modules.module._global_forward_pre_hooks
"""The forward pre-hooks every module call runs, which register_module_forward_pre_hook adds to:
one is armed and disarmed each step by a dictionary store and pop (between_steps.py), with no
handle made each time."""


def _built_without_cuda(device: int) -> tuple[int, int, int]:
    raise RuntimeError("this torch was built without CUDA")


_cuda_current_stream: Callable[[int], tuple[int, int, int]] = getattr(torch._C, "_cuda_getCurrentStream", _built_without_cuda)
"""(stream id, device index, device type) of a CUDA device's current stream, looked up in C."""

STREAMS_KEPT = 64
"""Streams current_stream keeps an object of at most: cleared when full (a script making a stream a step)."""

_streams: dict[tuple[int, int, int], Any] = {}


def current_stream(device: int) -> Any:
    """The stream a kernel or copy on CUDA device `device` is queued on now: torch's current stream
    there, as torch.cuda.current_stream(device) gives it. That one builds a new Stream object
    in Python at every call, 4 of the 5 us an event's record() cost on an H200's host
    (bench/opcost.py); here it is one C call and a dictionary look-up, one object kept per stream."""
    key = _cuda_current_stream(device)
    stream = _streams.get(key)
    if stream is None:
        if len(_streams) >= STREAMS_KEPT:
            _streams.clear()
        stream = _streams[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return stream


def _foreach_norm_takes_dtype() -> bool:
    try:
        torch._foreach_norm([torch.ones(1, dtype=torch.float16)], 2, dtype=torch.float32)
    except (TypeError, RuntimeError):
        return False
    return True


FOREACH_NORM_DTYPE = _foreach_norm_takes_dtype()
"""Whether _foreach_norm takes the dtype to compute in (fp16 gradients' norms in fp32)."""


_DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")
"""Where torch keeps DTensor and its placements (the second before torch 2.5)."""


def _dtensor_module(tensor: Any) -> Any:
    """The module whose DTensor tensor is, None for any other tensor. Looked up, not imported:
    a DTensor exists only once its module is imported, and a DDP job need not pay for the import."""
    return next((module for name in _DTENSOR_MODULES if isinstance(tensor, getattr(module := sys.modules.get(name), "DTensor", ()))), None)


def is_dtensor(tensor: Any) -> bool:
    """Whether tensor is a DTensor: a parameter or gradient that FSDP2's fully_shard or tensor
    parallelism split over ranks. A plain tensor or parameter is told by its type alone."""
    kind = type(tensor)
    return kind is not torch.Tensor and kind is not torch.nn.Parameter and _dtensor_module(tensor) is not None


def replicated(tensor: Any) -> Any:
    """A DTensor whole on every rank: redistributed to Replicate on every dimension of its mesh
    (a reduction over the ranks for a partial one, nothing for one already replicated)."""
    mesh = tensor.device_mesh
    return tensor.redistribute(mesh, [_dtensor_module(tensor).Replicate()] * mesh.ndim)


class _SkipDirs:
    """Directories put on torch.compile's skip list, and how to take them off again."""

    def __init__(self, trace_rules: Any, added: list[str]) -> None:
        self._trace_rules = trace_rules
        self._added = added

    def remove(self) -> None:
        for directory in self._added:
            self._trace_rules.SKIP_DIRS.remove(directory)
        self._trace_rules._recompile_re()


def dynamo_skips(package: str) -> _SkipDirs | None:
    """Put package's files on torch.compile's skip list, as torch's own DDP forward is: dynamo
    runs its functions as they are, never traced, and compiles what they call. ddptop's
    wrappers count and time; traced, a wrapper of DDP's forward breaks the graph at its clock
    (with a UserWarning in the rank's log) and recompiles as its counts change, and a compiled
    optimizer step would trace the guard. Called once torch._dynamo is imported (DDP's
    constructor imports it), never importing it: that costs a rank most of a second."""
    trace_rules = sys.modules.get("torch._dynamo.trace_rules")
    if trace_rules is None or not hasattr(trace_rules, "add"):
        return None
    before = set(trace_rules.SKIP_DIRS)
    trace_rules.add(package)
    return _SkipDirs(trace_rules, [directory for directory in trace_rules.SKIP_DIRS if directory not in before])


def scaler_scale(scaler: Any) -> torch.Tensor | None:
    """The scale a GradScaler multiplies the loss by; None before its first scale() or when disabled."""
    scale: torch.Tensor | None = getattr(scaler, "_scale", None)
    return scale


def flight_recorder_dumps() -> list[Callable[..., bytes]]:
    """torch's flight-recorder dumps: the generic recorder's (torch 2.8 and later: gloo's
    collectives, and any backend's that records there) and NCCL's own, which
    ProcessGroupNCCL records into and only `_dump_nccl_trace` reads."""
    c10d = getattr(torch._C, "_distributed_c10d", None)
    names = ("_dump_nccl_trace", "_dump_fr_trace")
    return [dump for name in names if (dump := getattr(c10d, name, None)) is not None]


PIPELINE_STAGE_MODULE = "torch.distributed.pipelining.stage"
"""Where pipeline stages are defined: wrapped once a script imports it (pipelining.py), never imported for it."""

PIPELINE_SHAPES = ("_forward_metadata_inference", "_shape_inference")
"""PipelineStage's run of its module at its first step to learn its shapes: torch 2.13's name, then
the earlier one's (which ran it on meta tensors under no_grad)."""


def pipeline_stage(module: Any) -> tuple[Any, str | None]:
    """torch.distributed.pipelining.stage's base class of stages (whose scale_grads a step
    ends with), and the name of PipelineStage's shape inference; None where absent."""
    stage = getattr(module, "PipelineStage", None)
    return getattr(module, "_PipelineStageBase", None), next((n for n in PIPELINE_SHAPES if hasattr(stage, n)), None)


def missing() -> list[str]:
    """The private names above that the running torch lacks (a GradScaler's and a DDP model's
    instance attributes are looked for on fresh instances)."""
    absent = [name for name in ("_foreach_norm", "_foreach_mul_") if not hasattr(torch, name)]
    absent += [f"torch._C.{n}" for n in ("_set_grad_enabled", "_current_graph_task_id") if not hasattr(torch._C, n)]
    if torch.backends.cuda.is_built() and not hasattr(torch._C, "_cuda_getCurrentStream"):
        absent.append("torch._C._cuda_getCurrentStream")
    absent += [] if hasattr(torch.Tensor, "_values") else ["torch.Tensor._values"]
    absent += [] if hasattr(torch.nn.Module, "_call_impl") else ["torch.nn.Module._call_impl"]
    absent += [f"DistributedDataParallel.{n}" for n in ("_get_ddp_logging_data",) if not hasattr(DistributedDataParallel, n)]
    trace_rules = importlib.import_module("torch._dynamo.trace_rules")  # imported here only: dynamo_skips never does
    absent += [f"torch._dynamo.trace_rules.{n}" for n in ("add", "SKIP_DIRS", "_recompile_re") if not hasattr(trace_rules, n)]
    try:
        stage_module = importlib.import_module(PIPELINE_STAGE_MODULE)
    except ImportError:  # torch before 2.4 has no pipelining: nothing to wrap
        stage_module = None
    if stage_module is not None:
        base, shapes = pipeline_stage(stage_module)
        absent += [] if hasattr(base, "scale_grads") else [f"{PIPELINE_STAGE_MODULE}._PipelineStageBase.scale_grads"]
        absent += [] if shapes else [f"PipelineStage.{PIPELINE_SHAPES[0]}"]
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_class is None:
        absent.append("torch.amp.GradScaler")
    elif not hasattr(scaler_class("cpu"), "_scale"):
        absent.append("GradScaler._scale")
    return absent
