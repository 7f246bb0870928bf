"""The real program in a real terminal (tmux): launch's dashboard on a real
2-rank job at 80x24 and, resized, at 200x50; quit leaving the job running;
attach to it from another terminal."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import uuid

import psutil
import pytest
from support import DDPTOP, EXAMPLE, wait_for

from ddptop.core import rundir

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]


class Tmux:
    def __init__(self, socket_name: str) -> None:
        self.socket = socket_name

    def __call__(self, *args: str) -> str:
        # COLUMNS/LINES in the environment would override the pty's real size
        # for every program in the tmux server (shutil.get_terminal_size).
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True, env=env).stdout

    def screen(self, session: str) -> str:
        return self("capture-pane", "-p", "-t", session)

    def wait_screen(self, session: str, *needles: str, timeout: float = 60) -> str:
        """The screen once every needle is on it; on a timeout the failure shows the screen."""
        try:
            wait_for(lambda: all(n in self.screen(session) for n in needles), timeout, f"{needles} on {session}")
        except BaseException:
            size = self("display", "-p", "-t", session, "#{window_width}x#{window_height}").strip()
            print(f"--- {session} ({size}) ---\n{self.screen(session)}")
            raise
        return self.screen(session)


@pytest.fixture
def tmux():
    server = Tmux(f"ddptop-test-{uuid.uuid4().hex[:8]}")
    yield server
    subprocess.run(["tmux", "-L", server.socket, "kill-server"], capture_output=True)


@pytest.fixture
def run_path(tmp_path):
    """The job's run directory; whatever happens, its job is stopped at the end."""
    path = tmp_path / "run"
    yield path
    meta = path / "meta.json"
    if meta.exists():
        pid = json.loads(meta.read_text()).get("supervisor_pid")
        if pid and psutil.pid_exists(pid):
            os.kill(pid, signal.SIGTERM)
            psutil.wait_procs([psutil.Process(pid)], timeout=20)


def test_launch_dashboard_leave_running_then_attach(tmux, ddptop_home, run_path):
    env = f"DDPTOP_HOME={ddptop_home} TERM=xterm-256color"
    tmux(
        "new-session",
        "-d",
        "-s",
        "launch",
        "-x",
        "80",
        "-y",
        "24",
        f"{env} {DDPTOP} launch {EXAMPLE} --gpus 2 --steps 1000000 --run-dir {run_path}; echo LAUNCH-EXITED $?; sleep 60",
    )
    small = tmux.wait_screen("launch", "world 2", "NODE  RANK", "q quit")
    wait_for(lambda: _rank_rows(tmux.screen("launch")) == 2, 60, "both rank rows at 80x24")
    assert "running" in small and all(len(line) <= 80 for line in small.splitlines())

    tmux("resize-window", "-t", "launch", "-x", "200", "-y", "50")
    wide = tmux.wait_screen("launch", "CPU %", "RSS", "throughput", "step time", "loss", "own work per rank")
    assert "GPU MEM" not in wide  # CPU ranks have no GPU figures: no empty columns for them
    wait_for(lambda: re.search(r"samples/s┤", tmux.screen("launch")), 30, "the throughput chart's axis with its unit")
    wide = tmux.screen("launch")
    assert _rank_rows(wide) == 2
    assert re.search(r"\d\d:\d\d .*\d\d:\d\d", wide), wide  # the time axis, labelled

    tmux("send-keys", "-t", "launch", "q")
    tmux.wait_screen("launch", "Quit the dashboard", "Leave it running")
    tmux("send-keys", "-t", "launch", "l")
    tmux.wait_screen("launch", "the job runs on headless", "LAUNCH-EXITED 0")

    run = rundir.RunDir(run_path)
    meta = json.loads((run_path / "meta.json").read_text())

    def hello_pids() -> list[int]:
        return [r["pid"] for r in rundir.read_events(run) if r["type"] == "rank_hello"]

    wait_for(lambda: len(hello_pids()) == 2, 30, "both hellos flushed to the event log")  # flushed about once a second
    pids = hello_pids()
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids) and run.state() == "running"

    tmux(
        "new-session", "-d", "-s", "attach", "-x", "120", "-y", "30", f"{env} {DDPTOP} attach; echo ATTACH-EXITED $?; sleep 60"
    )  # no argument: the newest running job
    attached = tmux.wait_screen("attach", "world 2", "running")
    wait_for(lambda: _rank_rows(tmux.screen("attach")) == 2, 30, "both rank rows in the attached dashboard")
    assert "up 00:00" not in attached  # attached late, it shows the run's history, not an empty start
    tmux("send-keys", "-t", "attach", "Enter")  # rank 0's detail: its stacks, dumped now
    tmux.wait_screen("attach", "rank 0  node 0", "main thread now", "D stacks now")
    tmux("send-keys", "-t", "attach", "D")
    wait_for(lambda: re.search(r"last stack dump, \d\d:\d\d:\d\d by (py-spy|faulthandler)", tmux.screen("attach")), 30, "rank 0's stacks")
    # The dump's own first lines: py-spy's "Process N: ..." (its threads below it may be cut off when
    # a long live stack leaves the dump's panel two rows on a 30-row terminal), or faulthandler's threads.
    assert re.search(r"Process \d+: |[Tt]hread (\d+|0x[0-9a-f]+) ", tmux.screen("attach")), tmux.screen("attach")
    tmux("send-keys", "-t", "attach", "Escape")
    tmux.wait_screen("attach", "NODE  RANK")
    tmux("send-keys", "-t", "attach", "q")
    tmux.wait_screen("attach", "ATTACH-EXITED 0")
    assert run.state() == "running"

    os.kill(meta["supervisor_pid"], signal.SIGTERM)
    wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 15, "the ranks to stop with the job")


def _rank_rows(screen: str) -> int:
    return sum(1 for line in screen.splitlines() if line.split()[:2] in (["0", "0"], ["0", "1"]))
