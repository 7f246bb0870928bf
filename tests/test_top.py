"""`ddptop` alone: the job list, the watch of a job ddptop did not launch, and what it says over time.

The judge and the list are driven with plain data; the watch runs on a real torchrun job on
gloo that ddptop did not start, with the real dashboard attached to the watcher's socket.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_pynvml import FakeNvml
from support import SCRIPTS, free_port, until, wait_for
from test_outside import stop
from textual.widgets import Log

from ddptop.core.rundir import RunDir
from ddptop.supervisor.outside.discovery import Job, Rank
from ddptop.supervisor.outside.judge import MEMORY_SAMPLES, ODD_S, STALLED_S, Judge
from ddptop.supervisor.outside.looks import Place
from ddptop.supervisor.outside.watch import NO_LOG, Look, Watch, launch_command, unreadable
from ddptop.supervisor.sampler import Sampler
from ddptop.supervisor.serving.hub import Hub
from ddptop.tui.app import DdptopApp
from ddptop.tui.job_list import JobList, JobRow
from ddptop.tui.screens.stacks import StacksScreen
from ddptop.tui.source import LiveSource
from ddptop.tui.widgets.job_header import FROM_OUTSIDE
from ddptop.tui.widgets.rank_table import RankTable


def rank(n: int, status: str = "sleeping", cpu: float | None = 50.0, rss: int | None = 1 << 30) -> Rank:
    return Rank(1000 + n, n, n, 3, 3, 0, status, cpu, rss, 4, 0.0, ["python", "train.py"], "me")


def job(*ranks: Rank) -> Job:
    return Job(("torchrun", "r1"), "torchrun", 999, ["torchrun", "--nproc-per-node", "3", "train.py", "--lr", "0.1"], list(ranks))


WAITING = Place("train.py:120 in main", "all_reduce", ())


def test_a_stopped_rank_is_said_once_and_again_after_it_ran():
    judge = Judge()
    assert judge.observe(job(rank(0), rank(1)), {}, 0.0) == []
    [said] = judge.observe(job(rank(0), rank(1, "stopped")), {}, 1.0)
    assert said.ranks == [1] and said.text == "rank 1 (pid 1001) is stopped (state T: SIGSTOP, or a debugger)"
    assert judge.observe(job(rank(0), rank(1, "stopped")), {}, 2.0) == []
    assert judge.observe(job(rank(0), rank(1)), {}, 3.0) == []
    assert [v.kind for v in judge.observe(job(rank(0), rank(1, "stopped")), {}, 4.0)] == ["stopped"]


def test_the_odd_rank_out_is_named_with_how_long_each_side_has_been_there():
    judge = Judge()
    odd = Place("data.py:88 in reload_shard", None, ())
    places = {1000: WAITING, 1001: WAITING, 1002: odd}
    ranks = job(rank(0), rank(1), rank(2))
    assert judge.observe(ranks, places, 10.0) == [], "a rank may be on its way into the collective"
    [said] = judge.observe(ranks, places, 10.0 + ODD_S + 40)
    assert said.kind == "odd_rank_out" and said.ranks == [2]
    assert said.text == "rank 2 in data.py:88 in reload_shard for 42 s; ranks 0-1 in all_reduce (train.py:120 in main) for 42 s"
    assert judge.observe(ranks, places, 60.0) == [], "said once"


def test_a_job_in_one_frame_using_no_cpu_is_stalled():
    judge = Judge()
    idle = job(rank(0, cpu=0.0), rank(1, cpu=1.0))
    places = {1000: WAITING, 1001: WAITING}
    assert judge.observe(idle, places, 0.0) == []
    assert judge.observe(job(rank(0, cpu=90.0), rank(1, cpu=1.0)), places, STALLED_S + 1) == [], "a rank at work"
    [said] = judge.observe(idle, places, STALLED_S + 2)
    assert said.kind == "stalled" and said.ranks == [0, 1]
    assert said.text == f"the job is stalled: every rank at train.py:120 in main in all_reduce for {STALLED_S + 2:.0f} s, using no CPU"


def test_memory_that_only_grows_is_named_once():
    judge = Judge()
    said = []
    for step in range(MEMORY_SAMPLES + 3):
        said += judge.observe(job(rank(0, rss=(1 << 30) + step * (100 << 20))), {}, float(step))
    assert [v.kind for v in said] == ["memory"]
    assert said[0].text.startswith("rank 0's memory keeps growing: 1.0 GiB to ")


def test_a_rank_gone_while_the_others_run_is_named():
    judge = Judge()
    judge.observe(job(rank(0), rank(1)), {}, 0.0)
    [said] = judge.observe(job(rank(0)), {}, 1.0)
    assert said.kind == "gone" and said.text == "rank 1 (pid 1001) is gone while rank 0 run"


def test_the_launch_command_keeps_the_script_and_its_own_arguments():
    assert launch_command(job(rank(0), rank(1), rank(2))) == "ddptop launch --gpus 3 train.py --lr 0.1"
    spawn = Job(("spawn", 5), "mp.spawn", 5, [sys.executable, "/x/spawn_it.py", "--steps", "9"], [rank(0), rank(1)])
    assert launch_command(spawn) == "ddptop launch --gpus 3 /x/spawn_it.py --steps 9"


def test_a_rank_py_spy_cannot_read_is_said_with_how_to_allow_it():
    said = unreadable(2, 4242)
    assert said.startswith("py-spy could not read rank 2 (pid 4242): ") and "CAP_SYS_PTRACE" in said and "ptrace_scope" in said


async def test_the_job_list_opens_the_job_under_the_cursor_and_escape_leaves():
    rows = [JobRow(11, "torchrun", "2 of 2", "torchrun train.py"), JobRow(22, "mp.spawn", "4 of 4", "python spawn.py", "rank 1 stopped")]
    app = JobList(rows, "3 Python processes of other users could not be read")
    async with app.run_test(size=(120, 20)) as pilot:
        assert "3 Python processes of other users could not be read" in str(app.query_one("#job-list-title").render())
        await pilot.press("down", "enter")
    assert app.return_value == 1
    app = JobList(rows)
    async with app.run_test(size=(120, 20)) as pilot:
        await pilot.press("escape")
    assert app.return_value is None


@pytest.mark.slow
async def test_a_job_ddptop_did_not_launch_is_watched_in_the_dashboard(tmp_path: Path):
    """A 3-rank torchrun job, not ddptop's, whose rank 2 sleeps in a function of its own while
    ranks 0 and 1 wait for it in all_reduce: the dashboard, attached to the watcher, lists the
    ranks with where they are, names the odd rank out, and then a rank stopped, each within 20 s."""
    mark = tmp_path / "onset"
    job_proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(free_port()),
         str(SCRIPTS / "hang_at_collective.py"), "--mode", "skip", "--mark", str(mark)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    run = RunDir(tmp_path / "watch")
    run.path.mkdir()
    watcher = None
    try:
        wait_for(mark.exists, 120, "rank 2 gone to its own branch")
        watcher = subprocess.Popen([sys.executable, "-m", "ddptop.supervisor.outside.watch", str(job_proc.pid), str(run.path)])
        wait_for(run.socket_path.exists, 30, "the watcher's socket")
        app = DdptopApp(LiveSource(run.socket_path), "attach", run.path, readonly=True, back=True)
        async with app.run_test(size=(200, 40)) as pilot:
            table = app.query_one(RankTable)
            await until(lambda: table.row_count == 3, "the three ranks", timeout=20)
            await until(
                lambda: table.cell(2, "where").startswith("hang_at_collective.py:46 in wait_for_checkpoint"),
                "rank 2's own frame",
                timeout=20,
            )
            texts = lambda: [str(e.get("text")) for e in app.state.events]  # noqa: E731
            await until(
                lambda: any(t.startswith("rank 2 in hang_at_collective.py:46 in wait_for_checkpoint for ") for t in texts()),
                "the odd rank out",
                timeout=20,
            )
            [odd] = [t for t in texts() if t.startswith("rank 2 in ")]
            assert "; ranks 0-1 in all_reduce (hang_at_collective.py:87 in main) for " in odd, odd
            await until(lambda: table.cell(2, "where").rstrip().endswith(" s)"), "how long it has been there", timeout=10)
            [told] = [t for t in texts() if "watched from outside" in t]
            assert f"ddptop launch --gpus 3 {SCRIPTS / 'hang_at_collective.py'} --mode skip --mark {mark}" in told, told
            await pilot.press("down", "down", "enter")  # rank 2's detail: no log of a job ddptop did not launch
            await until(lambda: NO_LOG in "\n".join(app.screen.query_one(Log).lines), "the log's absence, said", timeout=10)
            await pilot.press("escape")
            await pilot.press("D")  # every rank's stacks, read without pausing them, grouped
            await until(lambda: isinstance(app.screen, StacksScreen), "the stacks screen")
            shown = lambda: str(app.screen.query_one("#stacks-text").render())  # noqa: E731
            await until(
                lambda: "ranks 0-1:\n" in shown() and "\n\nrank 2:\n" in shown(), "the two ranks' stack once, rank 2's apart", timeout=20
            )
            assert shown().count("wait_for_checkpoint (") == 1, shown()
            await pilot.press("escape")
            rank2 = app.state.ranks[2].pid
            os.kill(rank2, signal.SIGSTOP)
            try:
                await until(lambda: f"rank 2 (pid {rank2}) is stopped (state T: SIGSTOP, or a debugger)" in texts(), "the stop", timeout=20)
                await until(lambda: table.cell(2, "state").strip() == "stopped", "its state in the table", timeout=10)
            finally:
                os.kill(rank2, signal.SIGCONT)
            await pilot.press("escape")
            await until(lambda: not app.is_running, "back to the job list")
        assert app.return_value == "back"
    finally:
        if watcher is not None:
            watcher.kill()
            watcher.wait(timeout=10)
        stop([job_proc])


def watched(tmp_path: Path, places: dict[int, Place | None]) -> list[str]:
    """The notices a watch gives on one look whose stack reads found places (pid -> place)."""
    tmp_path.mkdir()
    hub = Hub(RunDir(tmp_path), lambda command: None)
    ranks = job(rank(0), rank(1))
    watch = Watch(hub, ranks, Sampler(None))
    sample = {"type": "sample", "wall": 1.0, "procs": [], "gpus": []}
    watch.tell(Look(ranks, sample, places, set(places), 1.0))
    hub.flush()
    return [str(e["text"]) for e in hub.state.events if e["type"] == "notice"]


def test_py_spy_kept_out_is_said_once_a_read_that_fails_now_and_then_is_not(tmp_path: Path):
    """A busy rank's read fails now and then where ptrace is allowed: no notice of ptrace then.
    Where no rank of the job can be read, one notice says why and how to allow it."""
    assert watched(tmp_path / "one", {1000: WAITING, 1001: None}) == []
    [said] = watched(tmp_path / "none", {1000: None, 1001: None})
    assert said == unreadable(0, 1000)


async def test_an_outside_job_s_table_shows_what_is_read_from_outside_and_nothing_else(tmp_path: Path):
    """Two real processes watched as a job's ranks, NVML faked (no GPU here): the dashboard's
    table has each rank's threads and its GPU's memory and use, and leaves out the per-step
    columns, which cannot be read from outside, so WHERE fits 120 columns."""
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)]
    pids = [p.pid for p in sleepers]
    run = RunDir(tmp_path / "watch")
    run.path.mkdir()
    hub = Hub(run, lambda command: None)
    await hub.start()
    try:
        ranks = [Rank(pid, n, n, 2, 2, 0, "sleeping", None, None, 1, 0.0, ["python", "train.py"], "me") for n, pid in enumerate(pids)]
        watched = job(*ranks)
        nvml = FakeNvml(gpus=2, processes={0: [(pids[0], 3 * 2**30)], 1: [(pids[1], 5 * 2**30)]})
        watch = Watch(hub, watched, Sampler(nvml))
        watch.job, watch.discovered = watched, time.time()
        watch.start(watched)
        assert watch.tell(await asyncio.to_thread(watch.gather))
        hub.flush()
        app = DdptopApp(LiveSource(run.socket_path), "attach", run.path, readonly=True)
        async with app.run_test(size=(120, 30)):
            table = app.query_one(RankTable)
            await until(lambda: table.row_count == 2 and table.cell(1, "threads") != "-", "both ranks with their threads")
            header = table.render_line(0).text.split()
            assert header[:4] == ["NODE", "RANK", "PID", "STATE"] and header[-1] == "WHERE", header
            assert {"THREADS", "GPU", "%", "RSS"} <= set(header), header
            assert not {"STEP", "SAMPLES/S", "LOSS"} & set(header), header
            assert [table.cell(n, "threads") for n in (0, 1)] == ["1", "1"]
            assert "3.0 GiB" in table.cell(0, "gpu_used") and "5.0 GiB" in table.cell(1, "gpu_used"), table.cell(0, "gpu_used")
            assert table.cell(0, "gpu_util") == "50" and table.cell(1, "gpu_util") == "51"
            _, second = str(app.query_one("#header").render()).splitlines()
            assert second.startswith(FROM_OUTSIDE + "  rss "), second
    finally:
        await hub.finish(0)
        stop(sleepers)
