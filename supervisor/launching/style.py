"""How a script starts its data-parallel ranks, read from its source before launch.

Tutorials teach three ways, and each needs starting differently:

- torchrun: the script is one rank; torchrun starts one copy per GPU.
- spawn: the script starts its own ranks (`torch.multiprocessing.spawn`,
  `start_processes`, or `multiprocessing.Process` with `init_process_group(rank=...)`);
  started once, its children are the ranks.
- single: one process drives every GPU with `nn.DataParallel`; started once.

The script's syntax tree is read, never run: detection must not execute the
user's code. A script that spawns but also reads torchrun's LOCAL_RANK can run
either way and is left to torchrun. `--launch-style` overrides the guess.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

StyleChoice = Literal["auto", "torchrun", "spawn", "single"]
STYLES: tuple[StyleChoice, ...] = get_args(StyleChoice)
SPAWNERS = {"spawn": "torch.multiprocessing.spawn", "start_processes": "torch.multiprocessing.start_processes"}


@dataclass(frozen=True)
class Style:
    name: str
    """torchrun, spawn or single."""
    reason: str
    """Why, in words a user recognises in their script."""
    port_set_at: str | None = None
    """`file:line` where the script sets MASTER_PORT itself, for a port-in-use failure's root cause."""


TORCHRUN = Style("torchrun", "the script is one rank of a torchrun job")


@dataclass
class _Found:
    spawner: tuple[str, int] | None = None
    process_start: int | None = None
    rank_given: bool = False
    torchrun_env: bool = False
    data_parallel: int | None = None
    distributed: bool = False
    port_line: int | None = None


def _name(node: ast.AST) -> str | None:
    """The last name of a call's function: `mp.spawn` -> spawn, `DataParallel` -> DataParallel."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


class _Reader(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found = _Found()
        self.multiprocessing_names: set[str] = set()
        """Local names bound to torch.multiprocessing or multiprocessing (`import ... as mp`), or to their spawners."""

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in ("torch.multiprocessing", "multiprocessing"):
                self.multiprocessing_names.add(alias.asname or alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in ("torch.multiprocessing", "multiprocessing", "torch.multiprocessing.spawn"):
            self.multiprocessing_names.update(alias.asname or alias.name for alias in node.names)
        elif node.module == "torch":
            self.multiprocessing_names.update(alias.asname or "multiprocessing" for alias in node.names if alias.name == "multiprocessing")

    def visit_Call(self, node: ast.Call) -> None:
        name = _name(node.func)
        found = self.found
        owner = _dotted(node.func.value) if isinstance(node.func, ast.Attribute) else name or ""
        from_mp = owner in self.multiprocessing_names or owner.endswith("multiprocessing") or "mp" in owner.split(".")
        if name in SPAWNERS and from_mp and found.spawner is None:
            found.spawner = (SPAWNERS[name], node.lineno)
        elif name == "Process" and from_mp and found.process_start is None:
            found.process_start = node.lineno
        elif name == "init_process_group":
            found.distributed = True
            found.rank_given |= any(k.arg == "rank" for k in node.keywords) or len(node.args) >= 5
        elif name == "DataParallel" and found.data_parallel is None:
            found.data_parallel = node.lineno
        elif name == "DistributedDataParallel":
            found.distributed = True
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Subscript) and "MASTER_PORT" in _strings(target.slice) and self.found.port_line is None:
                self.found.port_line = node.lineno
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value in ("LOCAL_RANK", "RANK"):
            self.found.torchrun_env = True


def _port_setdefault(tree: ast.AST) -> int | None:
    """`os.environ.setdefault("MASTER_PORT", ...)` and `os.environ.update(MASTER_PORT=...)` set it too."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _name(node.func) not in ("setdefault", "update", "putenv"):
            continue
        if "MASTER_PORT" in _strings(node) or any(k.arg == "MASTER_PORT" for k in node.keywords):
            return node.lineno
    return None


def detect(script: Path, source: bytes | None = None) -> Style:
    """The launch style a script needs, from its source (read, parsed, never run)."""
    tree = ast.parse(script.read_bytes() if source is None else source, str(script))
    reader = _Reader()
    reader.visit(tree)
    found = reader.found
    line = found.port_line or _port_setdefault(tree)
    port_at = None if line is None else f"{script.name}:{line}"
    if found.spawner is not None and not found.torchrun_env:
        what, at = found.spawner
        return Style("spawn", f"{script.name} starts its own ranks with {what} (line {at})", port_at)
    if found.process_start is not None and found.rank_given and not found.torchrun_env:
        return Style(
            "spawn",
            f"{script.name} starts its own ranks with multiprocessing (line {found.process_start}) and gives each its rank",
            port_at,
        )
    if found.data_parallel is not None and not found.distributed:
        return Style("single", f"{script.name} wraps its model in nn.DataParallel (line {found.data_parallel})", port_at)
    return Style("torchrun", f"{script.name} is one rank of a torchrun job", port_at)


def chosen(script: Path, override: str) -> Style:
    """The style to launch with: the user's, when given, else the detected one."""
    if override != "auto":
        detected = detect(script)
        return Style(override, f"--launch-style {override} (detected: {detected.name})", detected.port_set_at)
    return detect(script)
