"""Seconds from a stall's onset to ddptop's verdict, under default settings.

A real gloo job (tests/scripts/stuck_loader.py: DataLoader, DistributedSampler,
AdamW) in which one rank's dataset blocks forever while fetching a batch;
the other ranks go on into that step's all-reduce and wait. The stuck rank
writes the wall time it blocked; the stall alert in the event log carries
the wall time of the verdict. `ddptop launch` gets no watchdog option, so
what is measured is what a user gets:

    python bench/stall.py --ranks 4 --rounds 3

Beside it, for scale: the default --hang-timeout (the restart) and the
collective timeouts a plain job waits for (gloo's 30 min, NCCL's 10).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead import DDPTOP
from scratch import scratch_home

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "scripts" / "stuck_loader.py"
sys.path.insert(0, str(REPO))


def one_stall(ranks: int, stuck_at: int) -> tuple[float, float, str]:
    """(seconds from the block to the verdict, the window the verdict says, its text)."""
    from ddptop.core import rundir
    from ddptop.core.policy import HANG_TIMEOUT_S

    with tempfile.TemporaryDirectory() as tmp:
        run, mark = rundir.RunDir(Path(tmp) / "run"), Path(tmp) / "mark"
        proc = subprocess.Popen(
            [
                *(DDPTOP, "launch", "--headless", "--run-dir", str(run.path), str(SCRIPT), "--gpus", str(ranks)),
                *("--stuck-rank", str(ranks - 1), "--stuck-at", str(stuck_at), "--mark", str(mark)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + HANG_TIMEOUT_S
            while time.monotonic() < deadline:
                alerts = [r for r in rundir.read_events(run) if r["type"] == "alert"] if run.events_path.exists() else []
                if alerts:
                    break
                time.sleep(0.2)  # polling the event log as a reader would
            else:
                raise SystemExit("no alert before the hang timeout")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        [alert] = alerts
        return alert["wall"] - float(mark.read_text()), alert.get("window_s", float("nan")), f"{alert['kind']}: {alert['text']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stuck-at", type=int, default=50, help="the step whose batch never comes")
    args = parser.parse_args()
    scratch_home()
    from ddptop.core.policy import HANG_TIMEOUT_S

    took = []
    for _ in range(args.rounds):
        seconds, window, text = one_stall(args.ranks, args.stuck_at)
        took.append(seconds)
        print(f"{seconds:.1f} s (window {window:.0f} s): {text}", flush=True)
    print(
        f"stall onset to verdict, {args.ranks} ranks, default settings: median {statistics.median(took):.1f} s "
        f"(min {min(took):.1f}, max {max(took):.1f}) over {args.rounds} rounds; "
        f"the default --hang-timeout restarts at {HANG_TIMEOUT_S:.0f} s; gloo's own timeout is 1800 s, NCCL's 600 s"
    )


if __name__ == "__main__":
    main()
