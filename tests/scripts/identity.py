"""What a rank sees of how it was started, written as JSON: a forked rank
(ddptop's template) and one torchrun started must see the same, down to
torch's and Python's random numbers, which differ from rank to rank.

    python identity.py OUT_DIR --any --args
"""

import json
import os
import random
import sys
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
        "draws_apart": [len({draw[at] for draw in draws}) == len(draws) for at in range(2)],
        "parent": Path(f"/proc/{os.getppid()}/cmdline").read_text().replace("\0", " "),
    }
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as out:
        json.dump(seen, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
