"""The dashboard driven by Pilot, attached over the real wire to a real hub fed by synthetic ranks."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import builders
import pytest
from support import until
from synthetic import synthetic_job
from textual.pilot import Pilot
from textual.widgets import Log
from textual.widgets._footer import FooterKey

from ddptop.core import rundir
from ddptop.core.eventlog import closed_segments
from ddptop.core.model.rank import RankState
from ddptop.supervisor.serving.hub import Hub
from ddptop.tui.app import DdptopApp
from ddptop.tui.screens.alerts import AlertsScreen
from ddptop.tui.screens.dialogs import ConfirmScreen, QuitScreen
from ddptop.tui.screens.help import HelpScreen
from ddptop.tui.screens.rank_detail import RankDetailScreen, live_stack
from ddptop.tui.source import LiveSource, ReplaySource
from ddptop.tui.widgets.job_header import fit, plain
from ddptop.tui.widgets.node_table import worst_rank
from ddptop.tui.widgets.rank_table import RankTable


class LiveJob:
    """A hub on a real socket, the commands it received, and its synthetic ranks."""

    def __init__(self, hub: Hub, commands: list) -> None:
        self.hub, self.commands = hub, commands
        self.feeder: asyncio.Task | None = None
        self.finished = False

    def feed(self, world: int = 4, rate_hz: float = 40.0, steps: int | None = None, slow_rank: int | None = None) -> None:
        self.feeder = asyncio.create_task(synthetic_job(self.hub.run.socket_path, world, rate_hz, steps, slow_rank, total_steps=1000))

    async def finish(self, code: int = 0) -> None:
        if self.feeder is not None:
            self.feeder.cancel()
            await asyncio.gather(self.feeder, return_exceptions=True)
        await self.hub.finish(code)
        self.finished = True


@pytest.fixture
async def job(tmp_path: Path, ddptop_home: Path):
    run = rundir.create(Path("job.py"), tmp_path / "run")
    run.write_meta({"id": run.id, "script": "job.py", "state": "running", "started": time.time()})
    commands: list = []
    hub = Hub(run, commands.append)
    await hub.start()
    hub.record({"type": "run", "wall": time.time(), "script": "/data/job.py", "nnodes": "1"})
    live = LiveJob(hub, commands)
    yield live
    if not live.finished:
        await live.finish()


def dashboard(job: LiveJob, mode: str = "attach") -> DdptopApp:
    return DdptopApp(LiveSource(job.hub.run.socket_path), mode, job.hub.run.path)


def table(app: DdptopApp) -> RankTable:
    return app.query_one(RankTable)


def column(app: DdptopApp, key: str) -> list[str]:
    t = table(app)
    return [t.cell(rank, key).strip() for rank in t.ranks_in_order()]


async def test_a_row_per_rank_and_the_header_update_live(job):
    job.feed(world=4)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)):
        await until(lambda: table(app).row_count == 4, "a row per rank")
        first = column(app, "step")
        await until(lambda: column(app, "step") != first, "steps to advance in the table")
        header = str(app.query_one("#header").render())
        assert "job.py" in header and "world 4" in header and "running" in header
        assert column(app, "rank") == ["0", "1", "2", "3"]


async def test_a_cpu_job_s_table_at_160_columns_shows_cpu_and_rss_not_empty_gpu_columns(job):
    job.feed(world=4)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)):
        await until(lambda: table(app).row_count == 4, "a row per rank")
        header = table(app).render_line(0).text
        assert "CPU %" in header and "RSS" in header and "GPU" not in header, header


async def test_at_80_columns_the_numbers_come_first_and_scroll_into_view_beside_their_rank(job):
    """A narrow terminal shows the alerts, loss and comm time in the header and the step time in
    the table at once, and right (column by column) brings the rest into view with NODE and
    RANK still there to say whose they are; WHERE comes last."""
    job.feed(world=4)
    app = dashboard(job)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(lambda: table(app).row_count == 4 and "-" not in column(app, "where") + column(app, "grad_norm"), "full rows")
        await pilot.press("p")  # the table as it is: no later record widens a column while it scrolls
        await until(lambda: app.main.paused, "the display paused")
        first, second = (app.main.header.render_line(y).text for y in (0, 1))
        assert "alerts 0" in first and "comm " in second and "loss " in second, (first, second)  # what says what is wrong
        assert "…" not in first + second, (first, second)  # what did not fit went whole, not cut
        rank_table = table(app)
        header = rank_table.render_line(0).text
        assert header.split()[:2] == ["NODE", "RANK"] and "STEP MS" in header and "WHERE" not in header, header
        rank_table.focus()
        await until(lambda: rank_table.has_focus, "the table focused: its keys are its own")
        row = rank_table.ranks_in_order().index(2) + 1
        for _ in range(30):  # to the end: a press past the last column's start leaves the table where it is
            x = rank_table.scroll_offset.x
            await pilot.press("right")
            if rank_table.scroll_offset.x == x:
                break
        header, line = rank_table.render_line(0).text, rank_table.render_line(row).text
        assert header.split()[:2] == ["NODE", "RANK"] and "WHERE" in header and "STEP MS" not in header, header
        assert line.split()[:2] == ["0", "2"] and column(app, "where")[2] in line, line
        for _ in range(30):
            await pilot.press("left")
        assert rank_table.scroll_offset.x == 0 and rank_table.render_line(0).text.split()[2] == "PID"


async def test_the_header_says_how_the_script_started_its_ranks(job):
    job.hub.record({"type": "run", "wall": time.time(), "script": "/data/dp.py", "launch_style": "single", "gpus": 2})
    job.feed(world=1)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)):
        await until(lambda: "1 process (DataParallel, 2 GPUs)" in str(app.query_one("#header").render()), "DataParallel in the header")
        job.hub.record({"type": "run", "wall": time.time(), "script": "/data/spawn.py", "launch_style": "spawn"})
        await until(lambda: "world 1  spawned by the script" in str(app.query_one("#header").render()), "spawned ranks in the header")


async def test_sort_and_reverse(job):
    job.feed(world=4, slow_rank=2)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 4 and "-" not in column(app, "step_ms_p50")[2], "step times")
        while table(app).sort_key != "step_ms_p50":
            await pilot.press("s")
        await until(lambda: column(app, "rank")[-1] == "2", "the slow rank sorted last")
        await pilot.press("S")
        await until(lambda: column(app, "rank")[0] == "2", "the slow rank first once reversed")
        await pilot.press("comma")  # nvitop's keys: the column before (TOKENS/S is not shown: no tokens), then back
        await until(lambda: table(app).sort_key == "samples_per_s", "sorted by the column before")
        await pilot.press("full_stop")
        await until(lambda: table(app).sort_key == "step_ms_p50", "sorted by the step time again")
        await until(lambda: column(app, "rank")[0] == "2", "the slow rank still first")


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_the_straggler_is_highlighted(job):
    job.feed(world=4, slow_rank=1)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)):
        await until(lambda: table(app).row_count == 4 and table(app).mark(1) == "straggler", "rank 1 flagged as a straggler")
        assert [table(app).mark(r) for r in (0, 2, 3)] == ["", "", ""]


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_filter_and_clear(job):
    job.feed(world=4)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 4, "rows")
        await pilot.press("slash", *"rank 2")
        await until(lambda: column(app, "rank") == ["2"], "only rank 2")
        await pilot.press("enter", "escape")
        await until(lambda: table(app).row_count == 4, "all rows back")


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_too_many_ranks_roll_up_by_node_with_the_worst_named_and_drill_down(job):
    job.feed(world=64, rate_hz=20.0, slow_rank=13)  # 8 nodes of 8 ranks
    app = dashboard(job)
    nodes = app.main.nodes
    async with app.run_test(size=(160, 30)) as pilot:
        await until(lambda: app.main.showing_nodes() and nodes.row_count == 8, "one line per node")
        await until(lambda: nodes.mark(1) == "straggler", "node 1 flagged by its straggler")
        assert nodes.cell(1, "WORST RANK").startswith("rank 13: straggler")
        assert nodes.cell(1, "RANKS") == "8/8" and nodes.cell(0, "NODE") == "0"
        assert all(nodes.mark(n) == "" for n in range(8) if n != 1)
        await pilot.resize_terminal(80, 24)  # the worst rank, what the rollup is for, in view at 80 columns
        await until(lambda: "rank 13: straggler" in nodes.render_line(2).text, "node 1's worst rank at 80 columns")
        await pilot.resize_terminal(160, 30)
        await pilot.press("down", "enter")
        await until(lambda: not app.main.showing_nodes() and table(app).row_count == 8, "node 1's ranks")
        assert column(app, "rank") == [str(r) for r in range(8, 16)]
        await pilot.press("escape")
        await until(lambda: app.main.showing_nodes(), "back to the nodes")
        await pilot.press("n")
        await until(lambda: not app.main.showing_nodes() and table(app).row_count == 64, "every rank")


async def test_pause_freezes_the_display_not_the_intake(job):
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 2, "rows")
        await pilot.press("p")
        shown, records = column(app, "step"), app.state.records
        await until(lambda: app.state.records > records + 20, "records to keep arriving")
        assert column(app, "step") == shown
        assert "paused" in str(app.query_one("#header").render())
        await pilot.press("p")
        await until(lambda: column(app, "step") != shown, "the display to resume")


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_detail_logs_and_help_screens(job):
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 2, "rows")
        await pilot.press("down", "enter")
        assert isinstance(app.screen, RankDetailScreen) and app.screen.rank == 1
        assert "rank 1" in str(app.screen.query_one("#detail-title").render())
        live = app.screen.query_one("#live-stack")
        await until(lambda: "job.py:42 in train_step" in str(live.render()), "the main thread's stack")
        assert str(live.render()).splitlines()[-1] == "torch/nn/modules/module.py:1750 in _call_impl"  # innermost last
        # The running job's rank's log comes from its own node, asked of the supervisor.
        await until(lambda: {"type": "command", "action": "log_tail", "rank": 1} in job.commands, "the log asked for")
        job.hub.record({"type": "log_tail", "wall": time.time(), "rank": 1, "restart": 0, "lines": ["[stdout] from node 1"]})
        log = app.screen.query_one("#log", Log)
        await until(lambda: "[stdout] from node 1" in log.lines, "the log tail its node sent")
        await pilot.press("escape")
        await pilot.press("l")
        assert isinstance(app.screen, RankDetailScreen) and app.focused is app.screen.query_one("#log")
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, (HelpScreen, RankDetailScreen))


async def test_a_sharded_rank_s_detail_shows_the_job_s_grad_norm_beside_its_own_shards_and_comm_by_dimension(job):
    """Two ranks of a sharded job tell their shares of a step's norm: the table's GRAD NORM is
    the norm they add up to, the detail gives it beside the norm of the rank's own shards. A
    timed step's collectives show in the COMM column, and in the detail per mesh dimension."""
    for rank in (0, 1):
        job.hub.record(builders.hello(rank, 2))
    dims = {"shard": {"all-gather": 3.0, "reduce-scatter": 1.5}, "replicate": {"all-reduce": 0.5}}
    job.hub.record(builders.step(0, 0, wall=time.time(), shard_norm=3**0.5, grad_sq_share=3.0, comm_ms=5.0, comm_dims=dims, comm_step=0))
    job.hub.record(builders.step(1, 0, wall=time.time(), shard_norm=1.0, grad_sq_share=1.0))
    app = dashboard(job)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 2 and column(app, "grad_norm") == ["2.00"] * 2, "the job's norm on both ranks")
        assert column(app, "comm_ms")[0] == "5.0"
        await pilot.press("enter")
        title = lambda: str(app.screen.query_one("#detail-title").render())  # noqa: E731
        await until(lambda: "grad norm 2.000, of this rank's shards 1.732" in title(), "rank 0's shards beside the norm")
        line = "comm by mesh dimension: replicate 0.5 ms (all-reduce 0.5); shard 4.5 ms (all-gather 3.0, reduce-scatter 1.5)"
        assert line in title()


async def test_a_rank_s_detail_at_80x24_keeps_its_title_and_a_log_in_view(job):
    """The detail's title says which rank it is: on a small terminal the charts give up rows
    rather than the screen scrolling the title out of view and the log to nothing."""
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(lambda: table(app).row_count == 2, "rows")
        await pilot.press("down", "enter")
        screen = app.screen
        assert isinstance(screen, RankDetailScreen)
        await until(lambda: "job.py:42 in train_step" in str(screen.query_one("#live-stack").render()), "the main thread's stack")
        await pilot.pause()
        title, log = screen.query_one("#detail-title"), screen.query_one("#log")
        assert title.region.y == 0 and "rank 1" in str(title.render()), title.region
        assert log.region.height >= 3 and log.region.bottom <= 23, log.region  # above the footer's row
        assert "GPU" not in str(title.render())  # a CPU rank
        gpu = {"index": 1, "name": "H100", "util": 97.0, "mem_used": 60 << 30, "mem_total": 80 << 30, "temperature": 87.0, "power_w": 312.0}
        job.hub.record({"type": "sample", "wall": time.time(), "procs": [{"rank": 1, "pid": 11, "gpu": 1}], "gpus": [gpu]})
        want = "GPU 1 H100  util 97%  memory 60.0 GiB/80.0 GiB  87 °C  312 W"
        await until(lambda: str(title.render()).endswith(want), "its GPU, temperature and power on the title's second line")
        await pilot.pause()
        assert title.region.height == 2 and log.region.height >= 3 and log.region.bottom <= 23, (title.region, log.region)


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_kill_rank_asks_first(job):
    job.feed(world=4)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 4, "rows")
        await pilot.press("down", "down", "K")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await until(lambda: not isinstance(app.screen, ConfirmScreen), "the question answered")
        await pilot.press("K", "y")
        await until(lambda: job.commands, "the kill command")
        assert job.commands == [{"type": "command", "action": "kill_rank", "rank": 2}]


async def test_restart_group_asks_first(job):
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 2, "rows")
        await pilot.press("R")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(lambda: job.commands, "the restart command")
        assert job.commands == [{"type": "command", "action": "restart"}]


def footer_actions(app: DdptopApp) -> set[str]:
    """The actions the footer on screen offers, as drawn."""
    return {key.action for key in app.screen.query(FooterKey)}


ON_THE_JOB = {"restart_group", "kill_rank", "profile", "dump_stacks"}


async def test_the_footer_offers_restart_kill_and_profile_only_while_the_job_runs(job):
    """A job that has ended, or a replay, has nothing to restart, kill or profile: the footer
    offered "R restart  K kill rank" there too, and a rank's detail "P profile", for keys that
    answered with a warning."""
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 2, "rows")
        await until(lambda: {"restart_group", "kill_rank"} <= footer_actions(app), "restart and kill offered")
        await pilot.press("down", "enter")
        await until(lambda: {"profile", "dump_stacks"} <= footer_actions(app), "the rank's profile and stack dump offered")
        profile = app.screen.query_one("#profile")
        assert "P captures its next steps" in str(profile.render())
        dump = app.screen.query_one("#stack")
        assert str(dump.render()) == "last stack dump\nno stack dump recorded for this rank"
        await pilot.press("D")
        await until(lambda: {"type": "command", "action": "stacks", "rank": 1} in job.commands, "the stacks asked for")
        wall = time.time()
        stack = "Thread 7 (idle): MainThread\n    train (job.py:42)"
        job.hub.record({"type": "stack", "rank": 1, "wall": wall, "source": "py-spy --native", "text": stack})
        heading = f"last stack dump, {time.strftime('%H:%M:%S', time.localtime(wall))} by py-spy --native"
        await until(lambda: str(dump.render()).startswith(heading + "\nThread 7"), "the dump, when and by what")
        await job.finish(0)
        await until(lambda: app.stream_ended, "the end of the stream")
        await until(lambda: "app.pop_screen" in (offered := footer_actions(app)) and not ON_THE_JOB & offered, "no profile offered")
        await until(lambda: str(profile.render()) == "no capture of this rank in this run", "no key offered in the words either")
        await pilot.press("escape")
        await until(lambda: "help" in (offered := footer_actions(app)) and not ON_THE_JOB & offered, "no restart or kill offered")
        await pilot.press("R")
        assert not isinstance(app.screen, ConfirmScreen)
    replay = DdptopApp(ReplaySource(job.hub.run), "replay", job.hub.run.path)
    async with replay.run_test(size=(160, 40)):
        await until(lambda: replay.stream_ended and "help" in footer_actions(replay), "the replay's footer")
        assert not ON_THE_JOB & footer_actions(replay)


async def test_a_dashboard_attached_read_only_asks_nothing_of_the_job(job):
    """`ddptop attach --readonly`, as nvitop's: the running job is shown, and no key restarts,
    kills or profiles it."""
    job.feed(world=2)
    app = DdptopApp(LiveSource(job.hub.run.socket_path), "attach", job.hub.run.path, readonly=True)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 2 and "help" in footer_actions(app), "rows and the footer")
        assert "running read-only" in str(app.query_one("#header").render())
        assert not ON_THE_JOB & footer_actions(app)
        await pilot.press("R", "down", "K")
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("enter")
        await until(lambda: "app.pop_screen" in footer_actions(app), "the rank's detail")
        assert not {"profile", "dump_stacks"} & footer_actions(app)
        await pilot.press("P", "D")
        assert str(app.screen.query_one("#profile").render()) == "no capture of this rank in this run"
    assert {c["action"] for c in job.commands} <= {"log_tail"}  # the detail reads the rank's log tail, and nothing more


async def at_the_quit_question(app: DdptopApp, pilot: Pilot) -> None:
    """Two ranks' rows drawn, then q: launch's dashboard asks what becomes of the job."""
    await until(lambda: table(app).row_count == 2, "rows")
    await pilot.press("q")
    assert isinstance(app.screen, QuitScreen)


async def test_quit_in_launch_can_leave_the_job_running(job):
    job.feed(world=2)
    app = dashboard(job, mode="launch")
    async with app.run_test(size=(160, 40)) as pilot:
        await at_the_quit_question(app, pilot)
        await pilot.press("l")
    await until(lambda: job.hub.viewers.attached == 0, "the dashboard detached")  # its commands, if any, came before
    assert app.return_value == "leave" and job.commands == []
    assert not job.feeder.done()  # the ranks still stream to the supervisor


async def stop_chosen(app: DdptopApp, pilot: Pilot, job: LiveJob) -> None:
    """At the quit question, s: the stop sent, and the dashboard still open, saying it stops."""
    await at_the_quit_question(app, pilot)
    await pilot.press("s")
    await until(lambda: job.commands, "the stop command")
    await until(lambda: any("stopping the job" in n.message for n in app._notifications), "the notice that it stops")
    assert app.is_running and app.state.exit is None  # it waits for the job's end


async def test_quit_in_launch_can_stop_the_job_and_closes_at_its_end(job):
    """The dashboard stays until the job has ended, so that `launch` returns once its ranks are
    gone (their GPUs free for the next job), with the job's exit status."""
    job.feed(world=2)
    app = dashboard(job, mode="launch")
    async with app.run_test(size=(160, 40)) as pilot:
        await stop_chosen(app, pilot, job)
        await job.finish(143)
        await until(lambda: not app.is_running, "the dashboard closed at the job's end")
    assert app.return_value == "stop" and job.commands == [{"type": "command", "action": "stop"}]
    assert app.state.exit is not None and app.state.exit["code"] == 143


async def test_quit_asked_again_while_the_job_stops_closes_at_once(job):
    job.feed(world=2)
    app = dashboard(job, mode="launch")
    async with app.run_test(size=(160, 40)) as pilot:
        await stop_chosen(app, pilot, job)
        await pilot.press("q")  # asked again
        await until(lambda: not app.is_running, "the dashboard closed")
    assert app.return_value == "stop" and app.state.exit is None


async def test_stopping_a_job_that_ended_while_the_question_was_open_just_quits(job):
    """The supervisor closes the dashboard's connection as its job ends: a stop chosen
    after that has nothing to stop, and the dashboard quits without an error."""
    job.feed(world=2)
    app = dashboard(job, mode="launch")
    async with app.run_test(size=(160, 40)) as pilot:
        await at_the_quit_question(app, pilot)
        await job.finish()
        await until(lambda: app.source._ended.is_set(), "the supervisor's end of stream")
        await pilot.press("s")
    assert app.return_value == "stop" and job.commands == []


async def test_quit_in_attach_only_detaches(job):
    job.feed(world=2)
    app = dashboard(job, mode="attach")
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: table(app).row_count == 2, "rows")
        await pilot.press("q")
    await until(lambda: job.hub.viewers.attached == 0, "the dashboard detached")  # its commands, if any, came before
    assert app.return_value is None and job.commands == []


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_a_late_dashboard_sees_the_history_and_the_end(job):
    job.feed(world=2, rate_hz=100, steps=50)
    await asyncio.wait_for(job.feeder, 10)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)):
        await until(lambda: column(app, "step") == ["49", "49"], "the history so far")
        await job.finish(3)
        await until(lambda: app.stream_ended, "the end of the stream")
        assert "ended, exit 3" in str(app.query_one("#header").render())
        assert column(app, "step") == ["49", "49"] and column(app, "state") == ["exited", "exited"]


async def test_a_tick_while_the_app_closes_its_screen_does_not_fail(job):
    """At exit Textual removes the main screen's widgets before it stops the
    timers, so a refresh may run with them gone (seen once in CI)."""
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(160, 40)):
        await until(lambda: table(app).row_count == 2, "rows")
        await app.query_one("#main").remove()
        assert not app.query("#main")
        app.main.redraw()  # must not fail on the widgets that are gone
        assert app.is_running and app.main.table.ranks_in_order() == [0, 1]


async def test_two_dashboards_attached_at_once_both_update(job):
    job.feed(world=2)
    first, second = dashboard(job), dashboard(job)
    async with first.run_test(size=(160, 40)):
        other = asyncio.create_task(_run_until_steps(second))
        await until(lambda: table(first).row_count == 2, "rows in the first dashboard")
        await asyncio.wait_for(other, 15)


async def _run_until_steps(app: DdptopApp) -> None:
    async with app.run_test(size=(120, 30)):
        await until(lambda: table(app).row_count == 2 and column(app, "step") != ["-", "-"], "steps in the second dashboard")


async def test_replay_shows_a_finished_run_from_its_rotated_log(job):
    job.hub.log.segment_bytes = 2048
    job.feed(world=3, rate_hz=100, steps=30)
    await asyncio.wait_for(job.feeder, 10)
    await job.finish(0)
    assert len(closed_segments(job.hub.run.events_path)) >= 3
    app = DdptopApp(ReplaySource(job.hub.run), "replay", job.hub.run.path)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: app.stream_ended, "the whole log")
        assert column(app, "step") == ["29", "29", "29"]
        assert app.state.records == sum(1 for _ in rundir.read_events(job.hub.run))  # the closed segments too
        assert "ended, exit 0" in str(app.query_one("#header").render())
        await pilot.press("q")


async def test_a_terminal_too_small_shows_a_message(job):
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(40, 10)) as pilot:
        await until(lambda: app.screen.has_class("too-small"), "the too-small message")
        assert app.query_one("#too-small").display
        await pilot.resize_terminal(120, 30)
        await until(lambda: not app.screen.has_class("too-small"), "the dashboard back at 120x30")


def test_log_tail_reads_only_the_end_of_a_long_log(tmp_path):
    from ddptop.tui.screens.rank_detail import log_tail

    log = tmp_path / "logs" / "none_x" / "attempt_0" / "1" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    tail = log_tail(tmp_path, {}, RankState(1, local_rank=1), lines=3)
    assert tail == ["[stdout] line 99997", "[stdout] line 99998", "[stdout] line 99999"]
    assert log_tail(tmp_path, {}, RankState(2, local_rank=2)) == ["(nothing logged in attempt 0)"]  # read when no job runs: no "yet"


def test_log_tail_is_the_ranks_own_attempt_and_node(tmp_path):
    """A rank's log is its own attempt's; a rank of another node is not shown this node's
    log of the same local rank (node 1's local rank 1 is rank 5 at 4 a node)."""
    from ddptop.tui.screens.rank_detail import log_tail

    for attempt in (0, 1):
        log = tmp_path / "logs" / "none_x" / f"attempt_{attempt}" / "1" / "stdout.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"attempt {attempt} of node 0's local rank 1\n")
    assert log_tail(tmp_path, {"node_rank": 0}, RankState(1, local_rank=1, restart=1)) == ["[stdout] attempt 1 of node 0's local rank 1"]
    [remote] = log_tail(tmp_path, {"node_rank": 0}, RankState(5, local_rank=1, node=1, host="b7", restart=1))
    assert "node 0" not in remote and "rank 5 ran on node 1 (b7)" in remote and "ddptop logs --rank 5" in remote


async def test_the_tokens_column_appears_once_a_rank_reads_token_ids(job):
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(220, 40)) as pilot:
        await until(lambda: table(app).row_count == 2, "rows")
        await pilot.pause()
        assert "TOKENS/S" not in table(app).render_line(0).text  # a job of images has no token column
        base = time.time()
        for n in range(3):
            step = {"type": "step", "rank": 7, "step": n, "wall": base + n, "step_ms": 10.0, "tokens": 4096, "loss": 2.5}
            job.hub.record(step)
        await until(lambda: "TOKENS/S" in table(app).render_line(0).text, "the tokens column")
        assert column(app, "tokens_per_s")[-1] == "4,096"
        header = str(app.query_one("#header").render())
        assert "4,096 tokens/s" in header and re.search(r"  loss [\d.]+  ", header), header  # the ranks' mean


async def test_the_stall_and_hang_alerts_stay_in_reach_under_later_notices_and_all_are_a_key_away(job):
    """A hang, then the restart's notices: at 200x50 the panel has four rows, and the alerts
    that explain the restart keep the first of them; `a` lists every event."""
    wall = time.time()
    job.hub.record({"type": "alert", "wall": wall, "kind": "stall", "ranks": [1], "step": 9, "text": "no step for 15 s: rank 1 stopped"})
    job.hub.record({"type": "alert", "wall": wall + 1, "kind": "hang", "ranks": [1], "step": 9, "text": "no step for 300 s"})
    for n in range(6):
        job.hub.record({"type": "notice", "wall": wall + 2 + n, "text": f"notice {n} after the hang"})
    await job.finish(0)
    app = DdptopApp(ReplaySource(job.hub.run), "replay", job.hub.run.path)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(lambda: app.stream_ended, "the whole log")
        panel = app.query_one("#alerts")
        await until(lambda: "no step for 300 s" in str(panel.render()), "the hang pinned")
        shown = str(panel.render()).splitlines()
        assert len(shown) == 4 and shown[0].startswith("▲") and "no step for 300 s" in shown[0] and "no step for 15 s" in shown[1]
        assert "job ended, exit 0" in shown[2], shown
        await pilot.press("a")
        assert isinstance(app.screen, AlertsScreen)
        listed = [str(line) for line in app.screen.query_one("#all-alerts").lines]
        assert len(listed) == 9 and "no step for 15 s" in listed[-1], listed
        await pilot.press("escape")
        assert not isinstance(app.screen, AlertsScreen)


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_p_in_a_rank_s_detail_asks_for_its_capture_and_shows_what_came_of_it(job):
    job.feed(world=2)
    app = dashboard(job)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(lambda: table(app).row_count == 2, "rows")
        await pilot.press("down", "enter")
        assert isinstance(app.screen, RankDetailScreen) and "P" in {binding.key for binding in app.screen.BINDINGS}
        await pilot.press("P")
        await until(lambda: {"type": "command", "action": "profile", "rank": 1} in job.commands, "the capture asked for")
        profile = app.screen.query_one("#profile")
        wall = time.time()
        started = "profile 1: capturing 10 steps of rank 1 from step 40 on; traces in /run/profiles"
        job.hub.record({"type": "capture", "wall": wall, "id": "1", "state": "started", "text": started, "ranks": [1], "steps": 10})
        await until(lambda: "capturing 10 steps of rank 1" in str(profile.render()), "the capture under way")
        phases = {"data": 0.5, "forward": 3.0, "backward": 4.0, "comm": 1.0, "overlap": 0.5, "optimizer": 1.0, "step": 9.5}
        ops = [["aten::addmm", 2.5, 0.0, 3.0]]
        job.hub.record(
            {
                "type": "profile",
                "rank": 1,
                "wall": wall,
                "id": "1",
                "first_step": 40,
                "steps": 10,
                "path": "/run/p.gz",
                "phases": phases,
                "ops": ops,
            }
        )
        await until(lambda: "9.5 ms a step" in str(profile.render()), "the capture's summary")
        assert "aten::addmm 2.50 ms" in str(profile.render()) and "trace: /run/p.gz" in str(profile.render())


def test_an_exited_rank_s_stack_reads_as_where_it_was_last_heard_from():
    """A replay's or a finished job's rank has no 'now': its stack is its last heartbeat's."""
    assert str(live_stack(["job.py:42 in train_step"], None)).startswith("main thread now\n")
    assert str(live_stack(["job.py:42 in train_step"], None, exited=True)).startswith("main thread when last heard from\n")


def test_a_header_line_too_wide_leaves_out_its_least_needed_parts_whole_and_in_order():
    parts = [plain(0, "alerts 2"), plain(3, "up 05:02"), plain(1, "restarts 0"), plain(3, "ETA 1:00"), plain(0, "comm 1.0 ms")]
    whole = "alerts 2  up 05:02  restarts 0  ETA 1:00  comm 1.0 ms"
    assert fit(parts, len(whole)) == fit(parts, 0) == whole  # 0: not laid out yet
    assert fit(parts, len(whole) - 1) == "alerts 2  up 05:02  restarts 0  comm 1.0 ms"  # the rightmost of the least needed
    assert fit(parts, 40) == "alerts 2  restarts 0  comm 1.0 ms"
    assert fit(parts, 10) == "alerts 2  comm 1.0 ms"  # what must stay stays: the widget's ellipsis cuts it
    assert fit([(0, "[b]x.py[/b]", 4), plain(2, "world 4")], 13) == "[b]x.py[/b]  world 4"  # markup takes no cells


def test_a_finished_job_s_nodes_name_no_rank_worst_for_having_exited():
    """After exit 0 every rank has exited as it should; the rollup named rank 0 of each node
    "exited", in red, over a job that went well."""
    ranks = [RankState(rank=0, exited=True), RankState(rank=1, exited=True)]
    finished = worst_rank(ranks, {}, now=0.0, live=False, finished=True)
    assert finished.mark == "" and "exited" not in finished.why, finished
    failed = worst_rank(ranks, {}, now=0.0, live=False)
    assert (failed.rank, failed.why, failed.mark) == (0, "exited", "alerting")
    ranks[1].alerts = 1
    assert worst_rank(ranks, {}, now=0.0, live=False, finished=True).why == "1 alert"
