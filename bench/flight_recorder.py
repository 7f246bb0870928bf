"""What reading torch's flight recorder costs the rank that reads it: its dump and its unpickling.

ddptop reads the recorder only once a rank has sat on one step for a few
seconds (trainer/flightrecorder.py): where each group stands in its
collectives. Timing a sharded job's collectives from it every second would
read it all the time. This fills the recorder of each of 2 ranks on gloo
with --entries all-reduces, as a job that ran that many collectives has it,
and times rank 0's dump (torch's _dump_fr_trace, C++) and the unpickling of
what it returns (pickle.loads), each the median of --reads reads. Both hold
the GIL: the training thread waits through them.

    python bench/flight_recorder.py --entries 2000
    python bench/flight_recorder.py --entries 200
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import time


def measure(entries: int, reads: int) -> None:
    import torch
    import torch.distributed as dist

    from ddptop.trainer import torchapi

    dist.init_process_group("gloo")
    x = torch.ones(64)
    for _ in range(entries):
        dist.all_reduce(x)
    dump = torchapi.flight_recorder_dumps()[-1]  # the generic recorder, gloo's
    dumping, loading = [], []
    for _ in range(reads):
        started = time.perf_counter()
        raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        dumped = time.perf_counter()
        trace = pickle.loads(raw)
        dumping.append(dumped - started)
        loading.append(time.perf_counter() - dumped)
    if dist.get_rank() == 0:
        print(
            f"flight recorder of {len(trace['entries'])} entries ({len(raw) / 1024:.0f} KiB), rank 0 of 2 on gloo, median of {reads} reads: "
            f"dump {statistics.median(dumping) * 1e3:.1f} ms, unpickling {statistics.median(loading) * 1e3:.1f} ms"
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=2000, help="collectives run first, and the recorder's size")
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    if "WORLD_SIZE" not in os.environ:
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": str(args.entries)}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, *sys.argv[1:]]
        sys.exit(subprocess.run(torchrun, env=env).returncode)
    measure(args.entries, args.reads)


if __name__ == "__main__":
    main()
