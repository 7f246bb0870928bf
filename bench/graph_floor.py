"""The floor's grad norm as one CUDA graph: what a guard whose launches do not grow with the
gradients would cost a step (`bench/inrank.py --graph-floor`, on a GPU).

On an H200 host the floor costs its step about what torch's fused norm costs there: its
host code allocates a result for each gradient, and the stack that gathers them unsqueezes
each one, so the floor grows with the model's tensors (docs/benchmarks.md). A graph captured
once replays all of its kernels in one launch. Its price: the gradients must stay at the
addresses it was captured with, which DDP's allocations a step at a time usually keep; so
each step looks at every gradient's address (a Python call each, no op), replays where they
are the captured ones, and takes the norm eagerly, as the floor does, where any moved. After
CAPTURE_AFTER steps at the same addresses it captures them again.

The total goes to the host as the floor's does: copied into a pinned buffer with an event
behind it, read a step later. The capture runs on a side stream in "thread_local" mode, so
that NCCL's watchdog thread, which queries its events meanwhile, is not refused; a capture
torch refuses is said once, and that job then stays eager (the floor).
"""

from __future__ import annotations

from typing import Any

CAPTURE_AFTER = 2
"""Steps the gradients must have kept their addresses before a capture."""


class GraphFloor:
    """The optimizer step pre-hook of the graph floor's job, with what its steps did."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.host = torch.empty((), pin_memory=True)
        self.event = torch.cuda.Event()
        self.stream = torch.cuda.current_stream()  # looked up once: the loop never switches streams
        self.side = torch.cuda.Stream()
        self.at: list[int] | None = None
        self.same = 0
        self.graph: Any = None
        self.total: Any = None
        self.refused: str | None = None
        self.read: list[float] = []
        self.replayed = self.eager = self.captured = 0

    def norm(self, grads: list[Any]) -> Any:
        torch = self.torch
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))

    def __call__(self, optimizer: Any, hook_args: Any, hook_kwargs: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        at = [grad.data_ptr() for grad in grads]
        if self.graph is not None and at == self.at:
            self.graph.replay()
            total = self.total
            self.replayed += 1
        else:
            self.same = self.same + 1 if at == self.at else 0
            self.at, self.graph = at, None
            total = self.norm(grads)
            self.eager += 1
            if self.same >= CAPTURE_AFTER and self.refused is None:
                self.capture(grads)
        if self.read and self.event.query():  # last step's, once its copy has passed
            self.read.append(float(self.host))
        self.host.copy_(total, non_blocking=True)
        self.event.record(self.stream)
        self.read.append(0.0)

    def capture(self, grads: list[Any]) -> None:
        graph = self.torch.cuda.CUDAGraph()
        self.side.wait_stream(self.stream)
        try:
            with self.torch.cuda.stream(self.side):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    total = self.norm(grads)
                finally:
                    graph.capture_end()
        except RuntimeError as error:
            self.refused = str(error).splitlines()[0][:200]
            return
        self.stream.wait_stream(self.side)
        self.graph, self.total = graph, total
        self.captured += 1

    def said(self) -> str:
        """What the job's steps did, for the bench's report."""
        if self.refused is not None:
            return f"the capture was refused ({self.refused}): every step took the norm eagerly, as the floor"
        return f"{self.replayed} steps replayed the graph, {self.eager} took the norm eagerly, {self.captured} captures"
