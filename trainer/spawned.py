"""Ranks that a script starts itself, as the tutorials teach:

    mp.spawn(train, args=(world_size,), nprocs=world_size)
    # in train(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"; os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)

ddptop starts such a script once under torchrun (launch style "spawn", see
supervisor/launching/style.py). That one process, the spawner, is no rank:
it hides torchrun's variables from the script, which then runs exactly as
under `python train.py` (torchrun's agent store and port would otherwise
take the place of the script's own). Each process that calls
`init_process_group` becomes a rank, with the rank and world size of that
call, reported like a torchrun rank. Every process of the tree dies with its
parent, so nothing outlives the supervisor.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from ddptop.core import launch_env
from ddptop.trainer import importwatch, runtime

TORCHRUN_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
)
"""What torchrun tells its one worker, which a spawning script must not see:
with TORCHELASTIC_USE_AGENT_STORE its ranks would wait for torchrun's store
at the script's own port, and a script that forgot MASTER_PORT would take
torchrun's."""

_report: runtime.Report | None = None
"""Set once this process has become a rank."""


def is_spawner() -> bool:
    """A torchrun worker of a job whose script starts its own ranks."""
    return os.environ.get(launch_env.LAUNCH_STYLE) == "spawn" and "RANK" in os.environ and launch_env.SPAWNER_PID not in os.environ


def is_spawned() -> bool:
    """A process the spawner (or one of its children) started, not yet a rank."""
    env = os.environ
    return (
        env.get(launch_env.LAUNCH_STYLE) == "spawn"
        and launch_env.SPAWNER_PID in env
        and env[launch_env.SPAWNER_PID] != str(os.getpid())
        and launch_env.RANK_PID not in env
    )


def become_spawner() -> None:
    runtime.die_with_parent()
    os.environ[launch_env.SPAWNER_PID] = str(os.getpid())
    for name in TORCHRUN_ENV:
        os.environ.pop(name, None)
    importwatch.after_import("torch", _patch_torch_safely)


def arm_spawned() -> None:
    """In a process the spawner started: become a rank at its init_process_group.

    It dies with its parent, whichever process of the script's tree that is.
    """
    runtime.die_with_parent(None)
    importwatch.after_import("torch", _patch_torch_safely)


def _identity(args: tuple, kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(rank, world size) as init_process_group will use them: its arguments, else the environment."""
    world = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
    rank = kwargs.get("rank", args[4] if len(args) > 4 else -1)
    env = os.environ
    rank = int(env.get("RANK", -1)) if rank == -1 else rank
    world = int(env.get("WORLD_SIZE", -1)) if world == -1 else world
    return None if rank < 0 or world < 1 else (int(rank), int(world))


def _become_rank(given: tuple[int, int]) -> None:
    global _report
    if _report is not None:
        return
    os.environ[launch_env.RANK_PID] = str(os.getpid())
    _report = runtime.activate(given, parent_env=None)


def _patch_torch_safely() -> None:
    try:
        _patch_torch()
    except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
        print(f"ddptop: instrumentation off: {exc}", file=sys.stderr)


def _patch_torch() -> None:
    """Wrap init_process_group (a process that calls it becomes a rank) and the
    spawner's per-child entry point (a rank's exception is reported before
    torch's spawn catches it, as the interpreter's excepthook never sees it)."""
    import torch.distributed as dist
    import torch.multiprocessing.spawn  # noqa: F401 - the package's `spawn` is the function; the module is in sys.modules

    torch_spawn = sys.modules["torch.multiprocessing.spawn"]

    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        mine = os.environ.get(launch_env.RANK_PID, str(os.getpid())) == str(os.getpid())
        given = _identity(args, kwargs) if mine else None
        if given is not None:
            _become_rank(given)
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            if _report is not None:
                _report(exc)
            raise
        if mine and given is None:
            _become_rank((dist.get_rank(), dist.get_world_size()))
        return result

    dist.init_process_group = init_process_group
    original_wrap = torch_spawn._wrap

    @functools.wraps(original_wrap)
    def _wrap(fn: Any, i: int, args: tuple, error_file: str) -> None:
        original_wrap(functools.partial(_reporting, fn), i, args, error_file)

    torch_spawn._wrap = _wrap  # type: ignore[attr-defined]


def _reporting(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except BaseException as exc:
        if _report is not None and not isinstance(exc, SystemExit):
            _report(exc)
        raise
