"""The torch ops a piece of code runs, by name: on a GPU each is a launch on the training thread,
so a test of the in-rank path counts them on the CPU, where the same ops run."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OpsSeen(TorchDispatchMode):
    """The torch ops run inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
