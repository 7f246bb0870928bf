"""ddptop's bootstrap, put first on each rank's PYTHONPATH by the launcher.

Python imports the first `sitecustomize` it finds at start-up, so this file
must (1) still run the one it shadows, if any, and (2) cost nothing unless
this process is a rank of a ddptop job: a torchrun worker (RANK is set) with
a supervisor address, and not a subprocess that a rank started itself (the
rank marks its own pid in the environment its children inherit). A script
that starts its own ranks is the exception: its children become ranks at
their init_process_group (trainer/spawned.py).
"""

import os
import sys


def _chain_to_shadowed_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _is_ddptop_rank() -> bool:
    env = os.environ
    me = str(os.getpid())
    return bool(env.get(launch_env.ADDRESS)) and "RANK" in env and env.get(launch_env.RANK_PID, me) == me


def start() -> None:
    """A script that starts its own ranks (trainer/spawned.py): its torchrun
    worker is no rank, the processes it starts are; any other torchrun
    worker is a rank from the start. A rank forked from the template
    (trainer/template) calls this once it has its rank's environment."""
    if os.environ.get(launch_env.LAUNCH_STYLE) == "spawn":
        from ddptop.trainer import spawned

        if spawned.is_spawner():
            spawned.become_spawner()
        elif spawned.is_spawned():
            spawned.arm_spawned()
    elif _is_ddptop_rank():
        from ddptop.trainer import runtime

        os.environ[launch_env.RANK_PID] = str(os.getpid())
        runtime.activate()


_chain_to_shadowed_sitecustomize()

try:
    from ddptop.core import launch_env  # the launch contract's names: three small modules, no more

    if os.environ.get(launch_env.ADDRESS):
        start()
except Exception as _exc:  # noqa: BLE001 - a broken monitor must never stop training
    print(f"ddptop: instrumentation off: {_exc}", file=sys.stderr)
