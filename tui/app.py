"""The ddptop dashboard: one Textual app for launch, attach and replay.

Records arrive in an async worker on the app's own loop (no threads, so no
call_from_thread) and are folded into a plain JobState, which the main screen
(screens/main.py) and a rank's detail read. The app owns the stream and the
talk with the supervisor: ten times a second it tells its screens what the job
allows now, and it sends what they ask of the job.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive

from ddptop.core.model.job import JobState
from ddptop.tui.screens.dialogs import QuitScreen
from ddptop.tui.screens.help import HelpScreen
from ddptop.tui.screens.main import TICK_S, MainScreen
from ddptop.tui.screens.rank_detail import RankDetailScreen
from ddptop.tui.source import Source

YIELD_EVERY = 200
"""Records folded before a keypress gets its turn: a read from the socket holds hundreds, and
at 1,024 ranks folding them all in one go kept a key waiting a tenth of a second."""
GONE = "the supervisor is gone (its job has ended): nothing was sent"


class DdptopApp(App[str | None]):
    """mode is "launch", "attach" or "replay"; the result says what quit chose."""

    CSS_PATH = "ddptop.tcss"
    TITLE = "ddptop"
    BINDINGS = [
        Binding("q", "quit_dashboard", "quit"),
        Binding("ctrl+q", "quit_dashboard", "quit", show=False, priority=True),
        Binding("question_mark", "help", "help"),
    ]

    stream_ended: reactive[bool] = reactive(False, init=False)
    """The records have all come: the job ended, its supervisor is gone, or the replay is read."""

    def __init__(self, source: Source, mode: str, run_dir: Path | None = None, readonly: bool = False, back: bool = False) -> None:
        super().__init__()
        self.source = source
        self.mode = mode
        self.readonly = readonly
        """Attached to watch only (`ddptop attach --readonly`, nvitop's flag): the job is neither
        restarted, killed, profiled nor held still for a stack dump from here; its ranks' log
        tails are still read."""
        self.state = JobState()
        self.stopping = False
        """In `launch`, the user chose to stop the job: the dashboard closes when it has ended."""
        self.back = back
        """Opened from the job list (`ddptop`): escape on the main screen goes back to it (the result "back")."""
        self.leaving = False
        """Set as the app begins to leave: the job's end and a second q may both ask it to, once."""
        self.main = MainScreen(self.state, run_dir, replay=not source.live, readonly=readonly)

    def get_default_screen(self) -> MainScreen:
        return self.main

    def watch_stream_ended(self, ended: bool) -> None:
        self.main.stream_ended = ended

    def on_mount(self) -> None:
        self.consume()
        self.set_interval(TICK_S, self.tick)

    @work(exclusive=True, group="source")
    async def consume(self) -> None:
        ingested = 0
        try:
            async for record in self.source.records():
                self.state.ingest(record)
                ingested += 1
                if ingested % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            self.source.finished(self.state)
        except OSError as exc:
            self.notify(f"lost the supervisor: {exc}", severity="error", timeout=10)
        self.stream_ended = True
        if self.stopping:
            await self.leave("stop")
            return
        if self.source.live:
            end = self.state.exit
            message = "the job has ended" + (f" (exit {end['code']})" if end else "; the supervisor is gone")
            self.notify(message + ": showing its last state", timeout=10)

    def job_running(self) -> bool:
        return self.source.live and not self.stream_ended and self.state.exit is None

    def may_act(self) -> bool:
        """Whether the dashboard may act on the job: restart, kill, a profile capture, a stack dump."""
        return self.job_running() and not self.readonly

    def tick(self) -> None:
        """Tell the screens what the job allows now: their footers follow it."""
        live, acting = self.job_running(), self.may_act()
        for screen in self.screen_stack:
            if isinstance(screen, (MainScreen, RankDetailScreen)):
                screen.live, screen.acting = live, acting

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def on_main_screen_asked(self, message: MainScreen.Asked) -> None:
        """The user confirmed a restart or a kill, or asked a watched job's stacks: sent, and
        said what became of it."""
        allowed = self.job_running() if message.action == "stacks" else self.may_act()
        if allowed and await self.source.command(message.action, message.rank):
            self.notify(message.done)
        else:
            self.notify(GONE, severity="warning")

    async def on_main_screen_left(self, message: MainScreen.Left) -> None:
        if self.back:
            await self.leave("back")

    async def on_rank_detail_screen_asked(self, message: RankDetailScreen.Asked) -> None:
        """A rank's detail asks for its log tail, a capture or its stacks: sent to the supervisor."""
        allowed = self.job_running() if message.action == "log_tail" else self.may_act()
        sent = allowed and await self.source.command(message.action, message.rank)
        if not sent and message.action != "log_tail":
            self.notify(GONE, severity="warning")

    async def action_quit_dashboard(self) -> None:
        if self.stopping:  # asked again while the job stops: close now, and leave it stopping
            await self.leave("stop")
            return
        if self.mode != "launch" or not self.job_running():
            await self.leave(None)
            return

        async def chosen(choice: str | None) -> None:
            if choice == "stop":
                # Closed at the job's end (consume), so that `launch` returns once its GPUs are free,
                # with the job's exit status, as after Ctrl-C headless.
                self.stopping = True
                await self.source.command("stop")  # a supervisor already gone has nothing left to stop
                if not self.stream_ended:
                    self.notify("stopping the job: the dashboard closes at its end (q: close now)", timeout=30)
                    return
            if choice is not None:
                await self.leave(choice)

        self.push_screen(QuitScreen(), chosen)

    async def leave(self, choice: str | None) -> None:
        """Close the connection and leave the app, once, with what becomes of the job."""
        if not self.leaving:
            self.leaving = True
            await self.source.close()
            self.exit(choice)
