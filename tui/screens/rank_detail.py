"""One rank up close: its step times over the run, where its main thread is now, its last stack dump,
its log tail."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from ddptop.core.format import ms, nbytes, significant
from ddptop.core.model import profiles
from ddptop.core.model.job import JobState
from ddptop.core.model.rank import RankState
from ddptop.core.places import is_script_line
from ddptop.core.rundir import own_log_tail
from ddptop.tui.widgets.chart import Chart
from ddptop.tui.widgets.rank_charts import comm_drawing, step_drawing
from ddptop.tui.widgets.time_axis import window

LOG_LINES = 200
LOG_ASK_S = 1.0
"""How often the screen is redrawn, and a running job's rank's log asked for."""
STACK_LINES = 12
"""The live stack's innermost frames shown; the outer ones are counted."""


def live_stack(lines: list[str], inside: str | None, exited: bool = False) -> Text:
    """The main thread's stack as the last heartbeat gave it, innermost last as Python prints
    tracebacks: the script's frames bold, the libraries' dim. Of a rank that has exited, it is
    where it was last heard from, not where it is."""
    heading = "main thread when last heard from" if exited else "main thread now"
    text = Text.from_markup(f"[b]{heading}[/b]" + (f", inside {inside}" if inside else "") + "\n")
    if not lines:
        text.append("no stack received yet", style="dim")
    if len(lines) > STACK_LINES:
        text.append(f"... {len(lines) - STACK_LINES} outer frames\n", style="dim")
    for line in lines[-STACK_LINES:]:
        text.append(f"{line}\n", style="bold" if is_script_line(line) else "dim")
    text.rstrip()
    return text


def gpu_line(rank: RankState) -> str:
    """Its GPU as NVML last read it: what the rank table's GPU columns leave out too, its
    temperature and power, where a GPU that throttles hot or capped shows first. Empty for a
    CPU rank; a figure the driver lacks is left out."""
    gpu = rank.gpu_reading
    if gpu is None:
        return ""
    parts = [f"GPU {gpu.index}" + (f" {gpu.name}" if gpu.name else "")]
    if gpu.util is not None:
        parts.append(f"util {gpu.util:.0f}%")
    if gpu.mem_used is not None and gpu.mem_total:
        parts.append(f"memory {nbytes(gpu.mem_used)}/{nbytes(gpu.mem_total)}")
    if gpu.temperature is not None:
        parts.append(f"{gpu.temperature:.0f} °C")
    if gpu.power_w is not None:
        parts.append(f"{gpu.power_w:.0f} W")
    return "  ".join(parts)


def norm_line(rank: RankState) -> str:
    """A sharded rank's grad norm beside the norm of its own shards, whose shares make it up
    (model/sharded_norm.py); empty for a rank whose gradients are whole."""
    shard = rank.latest.get("shard_norm")
    if shard is None:
        return ""
    return f"grad norm {significant(4)(rank.latest.get('grad_norm'))}, of this rank's shards {significant(4)(shard)}"


def comm_line(rank: RankState) -> str:
    """A sharded rank's comm in its last timed step, per mesh dimension and per op
    (trainer/collective_timer.py); empty where nothing timed it that way (DDP's)."""
    parts = []
    for dim, ops in sorted(rank.comm_dims.items()):
        split = ", ".join(f"{op} {ms(took)}" for op, took in sorted(ops.items()))
        parts.append(f"{dim} {ms(sum(ops.values()))} ms ({split})")
    return "comm by mesh dimension: " + "; ".join(parts) if parts else ""


def log_tail(run_dir: Path | None, meta: Mapping[str, Any], rank: RankState, lines: int = LOG_LINES) -> list[str]:
    """The end of the rank's stdout and stderr in its own attempt, read from this run directory:
    a replay's, or a job's that has ended.

    This run directory holds its own node's logs only: another node's rank has
    a log of the same local rank here, which is not its own. (While the job
    runs, the rank's own node sends its log: RankDetailScreen.Asked.)
    """
    if run_dir is None:
        return ["(no run directory on this machine: logs stay with the supervisor)"]
    here = int(meta.get("node_rank") or 0)
    if rank.node != here:
        return [
            f"(rank {rank.rank} ran on node {rank.node} ({rank.host or 'another host'}): its log is kept there; "
            f"on that host: ddptop logs --rank {rank.rank})"
        ]
    return own_log_tail(run_dir, str(meta.get("launch_style", "torchrun")), rank.local_rank, rank.restart, lines) or [
        f"(nothing logged in attempt {rank.restart})"
    ]


ON_THE_RANK = frozenset({"profile", "dump_stacks"})
"""The detail's actions on the running job, offered only while it runs (and not read-only)."""


def stack_dump(rank: RankState) -> Text:
    """Its last stack dump, saying when and by what it was taken: a stall's, or one asked for with D."""
    if rank.stack is None:
        return Text.from_markup("[b]last stack dump[/b]\nno stack dump recorded for this rank")
    when = time.strftime("%H:%M:%S", time.localtime(rank.stack_wall))
    told = f", {when} by {rank.stack_source}" if rank.stack_source else ""  # a state saved by an earlier ddptop says neither
    text = Text.from_markup(f"[b]last stack dump[/b]{told}\n")
    text.append(rank.stack)
    return text


def capture_lines(state: JobState, rank: int, running: bool) -> Text:
    """The latest profiler capture that concerns the rank: where it stands, what it found,
    and what differs from the median rank when others were captured with it. Where there is
    none, how to take one while the job runs."""
    capture = state.latest_capture
    if capture is None or (rank not in capture.ranks and rank not in capture.results):
        offer = ": P captures its next steps with torch.profiler" if running else " in this run"
        return Text(f"no capture of this rank{offer}", style="dim")
    text = Text.from_markup("[b]profile[/b]\n")
    result = capture.results.get(rank)
    if result is None:
        text.append(capture.text, style="dim")
        return text
    text.append("\n".join(profiles.rank_lines(result)))
    differ = profiles.differences(capture.results).get(rank)
    if differ is not None:
        text.append(f"\nagainst the median rank: {differ.split(': ', 1)[1]}", style="bold")
    return text


class RankDetailScreen(Screen[None]):
    BINDINGS = [
        Binding("escape,q", "app.pop_screen", "back"),
        Binding("l", "focus_log", "log"),
        Binding("w", "toggle_window", "window"),
        Binding("P", "profile", "profile"),
        Binding("D", "dump_stacks", "stacks now"),
    ]

    class Asked(Message):
        """The user asked something of the rank's job: its log tail ("log_tail"), a profile capture
        ("profile"), its stacks now ("stacks"). The app sends it to the supervisor, and says so
        where nothing could be sent."""

        def __init__(self, action: str, rank: int) -> None:
            super().__init__()
            self.action, self.rank = action, rank

    live: reactive[bool] = reactive(False)
    """A job runs whose supervisor can be asked: the rank's log comes from its own node (the app sets it)."""
    acting: reactive[bool] = reactive(False)
    """The dashboard may act on that job: a capture and a stack dump are offered (the app sets it)."""

    def __init__(
        self, state: JobState, rank: int, run_dir: Path | None, clock: Callable[[], float], whole: bool, focus_log: bool = False
    ) -> None:
        super().__init__()
        self.state, self.rank, self.run_dir, self.start_on_log = state, rank, run_dir, focus_log
        self.clock, self.whole = clock, whole

    def watch_acting(self) -> None:
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The profile capture and the stack dump are left out of the footer, and their keys do nothing, where no job runs."""
        return action not in ON_THE_RANK or self.acting

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        with Horizontal(id="rank-charts"):
            yield Chart(id="rank-step")
            yield Chart(id="rank-comm")
        yield Static(id="live-stack")
        yield Static(id="stack")
        yield Static(id="profile")
        yield Log(id="log", highlight=False)
        yield Footer()

    async def on_mount(self) -> None:
        await self.refresh_detail()
        self.set_interval(LOG_ASK_S, self.refresh_detail)
        if self.start_on_log:
            self.action_focus_log()

    async def refresh_detail(self) -> None:
        rank = self.state.ranks.get(self.rank)
        if rank is None:
            return
        if self.live:
            self.post_message(self.Asked("log_tail", rank.rank))
        more = [line for line in (gpu_line(rank), norm_line(rank), comm_line(rank)) if line]
        self.query_one("#detail-title", Static).update(
            f"[b]rank {rank.rank}[/b]  node {rank.node} ({rank.host})  local rank {rank.local_rank}  "
            f"pid {rank.pid}  restart {rank.restart}  step {rank.step}  phase {rank.phase}  dropped {rank.dropped}"
            + "".join(f"\n{line}" for line in more)
        )
        win = window(self.state.history, self.whole, self.state.started, self.clock())
        self.query_one("#rank-step", Chart).draw(step_drawing(win, rank.rank))
        self.query_one("#rank-comm", Chart).draw(comm_drawing(win, rank.rank))
        self.query_one("#live-stack", Static).update(live_stack(rank.live_stack, rank.inside, rank.exited))
        self.query_one("#stack", Static).update(stack_dump(rank))
        self.query_one("#profile", Static).update(capture_lines(self.state, rank.rank, self.acting))
        log = self.query_one(Log)
        log.clear()
        if self.live:
            if rank.log_tail is None:
                log.write_lines([f"(asking node {rank.node} for rank {rank.rank}'s log)"])
            else:
                log.write_lines(rank.log_tail or [f"(nothing logged in attempt {rank.restart} yet)"])
        else:
            log.write_lines(log_tail(self.run_dir, self.state.meta, rank))

    async def action_toggle_window(self) -> None:
        self.whole = not self.whole
        await self.refresh_detail()

    async def action_profile(self) -> None:
        if not self.acting:
            self.notify("no running job to capture: a replay or an ended job takes no capture", severity="warning")
            return
        self.post_message(self.Asked("profile", self.rank))
        self.notify(f"capture of rank {self.rank} asked for: its summary shows here when its trace is written")
        self.query_one("#profile", Static).update(capture_lines(self.state, self.rank, self.acting))

    async def action_dump_stacks(self) -> None:
        if not self.acting:
            self.notify("no running job to dump: a replay or an ended job has no stacks to take", severity="warning")
            return
        self.post_message(self.Asked("stacks", self.rank))
        self.notify(f"stacks of rank {self.rank} asked for (py-spy holds the rank still while it reads them): they show below")

    def action_focus_log(self) -> None:
        self.query_one(Log).focus()
