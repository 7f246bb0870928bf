"""The floors bench/inrank.py sets ddptop beside: optimizer step pre-hooks that take one fused
grad norm a step and read it late, as any NaN/Inf guard must, and nothing of ddptop's.

Floor is `--floor`: torch's `_foreach_norm` and the norm of the norms, as clip_grad_norm_
takes it, before each optimizer step; on a GPU copied into a pinned buffer made once, with an
event made once and recorded on a stream looked up once, and read at the next step once the
event has passed; on the CPU read at once.

ShardFloor is `--floor` for a sharded model (`--model fsdp2`): the same, of the rank's local
shards of its DTensor gradients (what a guard of a sharded step must norm at least, with no
collective). AgreeFloor (`--agree`) adds to it what keeping a non-finite step from the weights
on every rank takes at least: a flag from the norm on the device (norm - norm != 0) and one
all-reduce of it over the ranks, which each rank's optimizer would be handed as its found_inf.

GraphFloor is `--graph-floor` (a GPU only): the same norm as one CUDA graph. On an H200 host
the floor costs its step about what torch's fused norm costs there: its host code allocates a
result for each gradient, and the stack that gathers them unsqueezes each one, so the floor
grows with the model's tensors (docs/benchmarks.md). A graph captured once replays all of its
kernels in one launch. Its price: the gradients must stay at the addresses it was captured
with, which DDP's allocations a step at a time usually keep; so each step looks at every
gradient's address (a Python call each, no op), replays where they are the captured ones, and
takes the norm eagerly, as the floor does, where any moved. After CAPTURE_AFTER steps at the
same addresses it captures them again. A capture torch refuses is said once, and that job then
stays eager (the floor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CAPTURE_AFTER = 2
"""Steps the gradients must have kept their addresses before a capture."""


def norm(grads: list[Any]) -> Any:
    """The global L2 norm of grads, unread, as clip_grad_norm_ takes it."""
    import torch

    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


def capture(ops: Callable[[], Any], side: Any) -> tuple[Any, Any] | str:
    """ops captured once in a CUDA graph on the side stream, and what they returned there; or, where
    torch refuses the capture, the first line of its reason. The capture runs in "thread_local"
    mode, so that NCCL's watchdog thread, which queries its events meanwhile, is not refused."""
    import torch

    graph = torch.cuda.CUDAGraph()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                out = ops()
            finally:
                graph.capture_end()
    except RuntimeError as error:
        return str(error).splitlines()[0][:200]
    return graph, out


class Floor:
    """The floor's optimizer step pre-hook; `read` holds the norms read, 0.0 for one still in flight."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.host = torch.empty((), pin_memory=cuda)
        self.event = torch.cuda.Event() if cuda else None
        self.stream = torch.cuda.current_stream() if cuda else None  # looked up once: the loop never switches streams
        self.read: list[float] = []

    def total(self, grads: list[Any]) -> Any:
        return norm(grads)

    def __call__(self, optimizer: Any, hook_args: Any, hook_kwargs: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        total = self.total(grads)
        if self.event is None:
            self.read.append(float(total))
            return
        if self.read and self.event.query():  # last step's, once its copy has passed
            self.read.append(float(self.host))
        self.host.copy_(total, non_blocking=True)
        self.event.record(self.stream)
        self.read.append(0.0)


class ShardFloor(Floor):
    """The floor, of each gradient's local shard (DTensor._local_tensor: no op, no collective)."""

    def total(self, grads: list[Any]) -> Any:
        return norm([grad._local_tensor for grad in grads])


class AgreeFloor(ShardFloor):
    """The shard floor, then one all-reduce of its non-finite flag: every rank's verdict alike."""

    def total(self, grads: list[Any]) -> Any:
        import torch
        import torch.distributed as dist

        local = super().total(grads)
        flag = torch.ne(torch.sub(local, local), 0).float()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag


class GraphFloor(Floor):
    """The floor with its norm replayed as one CUDA graph while the gradients stay put (see above)."""

    def __init__(self) -> None:
        import torch

        super().__init__(cuda=True)
        self.side = torch.cuda.Stream()
        self.at: list[int] | None = None
        self.same = 0
        self.graph: Any = None
        self.captured_total: Any = None
        self.refused: str | None = None
        self.replayed = self.eager = self.captured = 0

    def total(self, grads: list[Any]) -> Any:
        at = [grad.data_ptr() for grad in grads]
        if self.graph is not None and at == self.at:
            self.graph.replay()
            self.replayed += 1
            return self.captured_total
        self.same = self.same + 1 if at == self.at else 0
        self.at, self.graph = at, None
        self.eager += 1
        if self.same >= CAPTURE_AFTER and self.refused is None:
            captured = capture(lambda: norm(grads), self.side)
            if isinstance(captured, str):
                self.refused = captured
            else:
                self.graph, self.captured_total = captured
                self.captured += 1
        return norm(grads)

    def said(self) -> str:
        """What the job's steps did, for the bench's report."""
        if self.refused is not None:
            return f"the capture was refused ({self.refused}): every step took the norm eagerly, as the floor"
        return f"{self.replayed} steps replayed the graph, {self.eager} took the norm eagerly, {self.captured} captures"
