"""Checkpoints that a kill cannot damage, and resuming from the newest good one.

The promise (DESIGN.md, "Restarts that lose nothing"): a run killed at any
moment and restarted ends with the parameters of an uninterrupted run. So a
checkpoint holds everything the next step depends on: the model, the
optimizer, the LR scheduler, every rank's RNG states (torch, CUDA, numpy,
Python) and the data position the script hands over (sampler epoch and
offset, say).

Writing (rank 0 only, after every rank has sent it its RNG states):

- to a hidden temp file, hashing the bytes as they go, then fsync, then a
  rename to `step-00000120.<digest>.pt` and an fsync of the folder; a kill
  at any point leaves either the old set of checkpoints or the new one,
  plus a temp file that names no checkpoint and is swept up later;
- the digest in the name is checked on load, so a file damaged after the
  fact (a truncated copy, a flipped bit) is never loaded: resume falls back
  to the previous good one and says so.

Unlike the rest of the monitor API these work without a ddptop supervisor
too: they are the script's own data, and losing them quietly would be worse
than any cost. torch is imported here, so this module is only loaded once
the script calls them.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch
import torch.distributed as dist

NAME = re.compile(r"^step-(\d{8,})\.([0-9a-f]{16})\.pt$")
DIGEST_CHARS = 16
READ_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or does not fit: said in one line."""


@dataclass(frozen=True)
class Resumed:
    """What `resume` restored: go on from step + 1, at the data position."""

    step: int
    data: dict[str, Any]
    path: Path
    damaged: list[str] = field(default_factory=list)
    """Newer checkpoint files passed over because their bytes did not check out."""


class _HashingWriter:
    """The file object torch.save writes through: hashes the bytes on their way."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.stream.write(data)

    def flush(self) -> None:
        self.stream.flush()


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP, so a checkpoint loads with or without the wrapper."""
    return getattr(model, "module", model)


def rng_state() -> dict[str, Any]:
    """This process's random generators, as plain values torch.load(weights_only) accepts."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")  # a script that never imported numpy never drew from it
    if numpy is not None:
        name, key, pos, has_gauss, gauss = numpy.random.get_state(legacy=True)
        state["numpy"] = (name, torch.from_numpy(key.astype("int64")), pos, has_gauss, gauss)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        name, key, pos, has_gauss, gauss = state["numpy"]
        numpy.random.set_state((name, key.numpy().astype("uint32"), pos, has_gauss, gauss))


def _gather_rng() -> list[dict[str, Any]] | None:
    """Every rank's RNG states on rank 0 (a collective: every rank calls it)."""
    rank, world = _rank_world()
    if world == 1:
        return [rng_state()]
    states: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(rng_state(), states, dst=0)
    return states


def save(
    directory: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    data: dict[str, Any] | None,
    keep: int,
) -> Path | None:
    """Write one checkpoint from rank 0; every rank must call it. Returns the path on rank 0."""
    if keep < 1:
        raise CheckpointError(f"keep must be at least 1, not {keep}")
    rngs = _gather_rng()
    if rngs is None:
        return None
    state = {
        "step": int(step),
        "model": _unwrap(model).state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "rng": rngs,
        "data": dict(data or {}),
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = _write(directory, step, state)
        _prune(directory, keep, path)
    except OSError as exc:
        raise CheckpointError(f"cannot write a checkpoint in {directory}: {exc.strerror or exc}") from None
    return path


def _write(directory: Path, step: int, state: dict[str, Any]) -> Path:
    temp = directory / f".step-{step:08d}.{os.getpid()}.tmp"
    with open(temp, "wb") as stream:
        writer = _HashingWriter(stream)
        torch.save(state, cast(BinaryIO, writer))  # a file-like object that hashes what passes through
        stream.flush()
        os.fsync(stream.fileno())
    final = directory / f"step-{step:08d}.{writer.digest.hexdigest()[:DIGEST_CHARS]}.pt"
    os.replace(temp, final)
    _fsync_dir(directory)
    return final


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable: it lives in the folder's entry list."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def candidates(directory: Path) -> list[Path]:
    """Checkpoint files by name, newest step first."""
    found = [p for p in directory.iterdir() if NAME.match(p.name)] if directory.is_dir() else []
    return sorted(found, key=lambda p: (int(_step(p)), p.stat().st_mtime), reverse=True)


def _step(path: Path) -> str:
    """The step in a checkpoint's name; only names NAME matches are passed here."""
    match = NAME.match(path.name)
    assert match is not None, path
    return match[1]


def _prune(directory: Path, keep: int, written: Path) -> None:
    """Keep the newest `keep`; drop others of the same step and dead writers' temp files."""
    step = _step(written)
    for path in candidates(directory):
        if path != written and _step(path) == step:
            path.unlink(missing_ok=True)
    for path in candidates(directory)[keep:]:
        path.unlink(missing_ok=True)
    for path in directory.glob(".step-*.tmp"):
        pid = path.name.rsplit(".", 2)[-2]
        if pid != str(os.getpid()):
            path.unlink(missing_ok=True)


def intact(path: Path) -> bool:
    """Whether the file's bytes hash to the digest its name promises."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(READ_CHUNK):
            digest.update(chunk)
    match = NAME.match(path.name)
    return match is not None and digest.hexdigest()[:DIGEST_CHARS] == match[2]


def load_newest(directory: Path) -> tuple[dict[str, Any], Path, list[str]] | None:
    """The newest checkpoint whose bytes check out, the path, and the names passed over."""
    damaged: list[str] = []
    for path in candidates(directory):
        try:
            if intact(path):
                return torch.load(path, map_location="cpu", weights_only=True), path, damaged
        except (OSError, RuntimeError, ValueError, EOFError):
            pass
        damaged.append(path.name)
    if damaged:
        raise CheckpointError(f"no intact checkpoint in {directory}: {', '.join(damaged)} failed the digest check")
    return None


def restore(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler: Any) -> Resumed | None:
    """Load the newest intact checkpoint into the given objects, on every rank."""
    rank, world = _rank_world()
    if rank == 0:
        _check_writable(directory)
    found = load_newest(directory)
    if found is None:
        return None
    state, path, damaged = found
    try:
        _unwrap(model).load_state_dict(state["model"])
        if optimizer is not None and state["optimizer"] is not None:
            optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
    except (RuntimeError, ValueError, KeyError) as exc:
        lines = str(exc).strip().splitlines()
        reason = next((line.strip() for line in lines[1:] if line.strip()), lines[0] if lines else type(exc).__name__)
        raise CheckpointError(f"checkpoint {path} does not fit this model: {reason}") from None
    rngs = state["rng"]
    if len(rngs) == world:
        set_rng_state(rngs[rank])
    elif rank == 0:
        print(f"ddptop: {path.name} was written by {len(rngs)} ranks, this job has {world}: random states not restored", file=sys.stderr)
    return Resumed(state["step"], state["data"], path, damaged)


def _check_writable(directory: Path) -> None:
    """Fail at the start of the run, not at its first checkpoint an hour later."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"checkpoint directory {directory} is not writable: {exc.strerror or exc}") from None
