"""What a rank sees of how it was started, written as JSON: a forked rank
(ddptop's template) and one torchrun started must see the same, down to
torch's and Python's random numbers, which differ from rank to rank.

    python identity.py OUT_DIR --any --args
"""

import faulthandler
import gc
import json
import locale
import os
import random
import signal
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))  # imports what DDP imports
    draws = [None] * dist.get_world_size()
    dist.all_gather_object(draws, (torch.initial_seed(), random.random()))
    seen = {
        "name": __name__,
        "file": __file__,
        "argv": sys.argv,
        "orig_argv": sys.orig_argv[1:],
        "path": sys.path,
        "cwd": os.getcwd(),
        "spec": repr(__spec__),
        "loader": type(__loader__).__name__,
        "package": __package__,
        "main": sys.modules["__main__"].__dict__ is globals(),
        "env": dict(os.environ),
        "session": os.getsid(0) == os.getpid() == os.getpgid(0),
        "stdio": [os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)],
        "buffered": [sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding],
        "cmdline": Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip(),
        "signals": {
            name: repr(signal.getsignal(getattr(signal, name)))
            for name in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGHUP", "SIGCHLD", "SIGUSR1", "SIGUSR2")
        },
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "faulthandler": faulthandler.is_enabled(),
        "gc": [gc.isenabled(), gc.get_threshold()],
        "limits": [sys.getrecursionlimit(), sys.getswitchinterval()],
        "warning_filters": [repr(f) for f in warnings.filters],
        "locale": locale.setlocale(locale.LC_ALL),
        "torch_state": [
            torch.get_num_threads(),
            torch.get_num_interop_threads(),
            torch.is_grad_enabled(),
            str(torch.get_default_dtype()),
            torch.get_float32_matmul_precision(),
            torch.are_deterministic_algorithms_enabled(),
            torch.is_anomaly_enabled(),
        ],
        "draws_apart": [len({draw[at] for draw in draws}) == len(draws) for at in range(2)],
        "parent": Path(f"/proc/{os.getppid()}/cmdline").read_text().replace("\0", " "),
    }
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as out:
        json.dump(seen, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
