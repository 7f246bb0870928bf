"""`ddptop` (or `ddptop top`): the dashboard on every PyTorch distributed job on this host.

A job ddptop launched is attached to as `ddptop attach` does. A job it did not
launch is watched from outside: a watcher process (supervisor/outside/watch.py)
serves what it reads of the job on a socket of its own, and the same dashboard
attaches to that, read-only. With one job the dashboard opens on it; with
several, the job list comes first, and escape in a job's view comes back to it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddptop.core import rundir
from ddptop.core.usage import OneLineParser

SOCKET_WAIT_S = 30.0
"""How long the watcher may take to serve its socket (its first look reads every rank)."""


def top(argv: list[str]) -> int:
    parser = OneLineParser(prog="ddptop top", description="the dashboard on every PyTorch distributed job on this host")
    parser.parse_args(argv)
    # A terminal closed under the dashboard: leave through the finally clauses, which end the
    # watcher and remove its folder.
    signal.signal(signal.SIGHUP, lambda signum, frame: sys.exit(128 + signum))
    from ddptop.supervisor.outside import looks
    from ddptop.supervisor.outside.discovery import discover
    from ddptop.tui.job_list import JobList, JobRow

    while True:
        seen = discover()
        if not seen.jobs:
            print("ddptop: no PyTorch distributed job runs on this host (`ddptop launch` starts one)")
            return 0
        chosen = 0
        if len(seen.jobs) > 1:
            rows = [
                JobRow(
                    job.id,
                    job.launcher,
                    f"{len(job.ranks)} of {job.world_size}" if job.world_size else str(len(job.ranks)),
                    shlex.join(job.command),
                    "; ".join(looks.verdicts(job, {})),
                )
                for job in seen.jobs
            ]
            unread = seen.unreadable
            picked = JobList(
                rows, f"{unread} Python processes of other users could not be read (the same user, or CAP_SYS_PTRACE)" if unread else ""
            ).run()
            if picked is None:
                return 0
            chosen = picked
        job = seen.jobs[chosen]
        result = _open(job.id, job.run_dir, back=len(seen.jobs) > 1)
        if result != "back":
            return 0


def _open(job_id: int, run_dir: str | None, back: bool) -> str | None:
    """The dashboard on one job, until it is left; "back" when escape asked for the list."""
    from ddptop.supervisor.launching.torchrun import die_with
    from ddptop.tui.app import DdptopApp
    from ddptop.tui.source import LiveSource

    if run_dir is not None:
        run = rundir.RunDir(Path(run_dir))
        return DdptopApp(LiveSource(run.socket_path), "attach", run.path, back=back).run()
    folder = Path(tempfile.mkdtemp(prefix="ddptop-top-"))
    with (folder / "watcher.log").open("w") as log:
        me = os.getpid()
        watcher = subprocess.Popen(
            [sys.executable, "-m", "ddptop.supervisor.outside.watch", str(job_id), str(folder)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            preexec_fn=lambda: die_with(me),  # ends with this dashboard, however it ends
        )
    try:
        run = rundir.RunDir(folder)
        deadline = time.monotonic() + SOCKET_WAIT_S
        while not run.socket_path.exists():
            if watcher.poll() is not None or time.monotonic() > deadline:
                print(f"ddptop: could not watch job {job_id}: {_last_line(folder / 'watcher.log')}", file=sys.stderr)
                return None
            time.sleep(0.05)
        return DdptopApp(LiveSource(run.socket_path), "attach", run.path, readonly=True, back=back).run()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(watcher.pid, signal.SIGTERM)
        watcher.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return lines[-1] if lines else "the watcher ended without a word"
