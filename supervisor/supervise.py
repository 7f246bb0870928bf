"""One supervised job: the torchrun child, sampling, summaries, signals, commands.

Everything runs on one asyncio loop in the supervisor process; the only
blocking calls (NVML and psutil) run in a worker thread. Records go through
the hub (hub.py), which logs them and serves them to dashboards.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from ddptop.supervisor import summary
from ddptop.supervisor.hub import Hub
from ddptop.supervisor.launcher import Torchrun
from ddptop.supervisor.rundir import RunDir
from ddptop.supervisor.sampler import Sampler
from ddptop.trainer import wire

SAMPLE_S = 1.0
FLUSH_S = 1.0
STATE_S = 1.0
"""Period of the "summary" record that dashboards plot; printing has its own."""


class Supervisor:
    def __init__(
        self,
        run: RunDir,
        torchrun: Torchrun,
        sampler: Sampler,
        summary_every: float,
        out: TextIO = sys.stdout,
    ) -> None:
        self.run = run
        self.torchrun = torchrun
        self.sampler = sampler
        self.summary_every = summary_every
        self.out = out
        self.hub = Hub(run, self.on_command)
        self.state = self.hub.state
        self.record = self.hub.record
        self._stop_signal: int | None = None
        self._stopping: asyncio.Task | None = None

    def on_command(self, command: wire.Frame) -> None:
        """A dashboard's request: stop the job, restart the group, kill a rank.

        Killing ranks is how a restart is asked of torchrun: it restarts the
        whole worker group while its --max-restarts budget lasts.
        """
        action = command["action"]
        if action == "stop":
            self._note(None, "stop requested from a dashboard")
            self._request_stop(signal.SIGTERM)
            return
        ranks = list(self.state.ranks.values())
        if action == "kill_rank":
            ranks = [r for r in ranks if r.rank == command.get("rank")]
        ours = self.torchrun.descendants()
        for rank in ranks:
            # A pid comes from the rank's own hello: signal it only if it
            # really is a process of this job, never whatever a frame names.
            if rank.pid in ours:
                os.kill(rank.pid, signal.SIGKILL)
        what = "restart of the group" if action == "restart" else f"kill of rank {command.get('rank')}"
        self._note(command.get("rank"), f"{what} requested from a dashboard")

    def _note(self, rank: int | None, text: str) -> None:
        self.record({"type": "action", "wall": time.time(), "rank": rank, "text": text})
        print(f"ddptop: {text}", file=sys.stderr, flush=True)

    async def main(self, meta: dict[str, Any]) -> int:
        """Run the job to its end; return the exit status for `ddptop launch`."""
        loop = asyncio.get_running_loop()
        await self.hub.start()
        self.record({"type": "run", **meta})
        await self.torchrun.start()
        self.run.update_meta(torchrun_pid=self.torchrun.pid)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, self._on_signal, signum)
        periodic = [
            asyncio.create_task(_every(SAMPLE_S, self._sample)),
            asyncio.create_task(_every(STATE_S, self._record_totals)),
            asyncio.create_task(_every(self.summary_every, self._print_summary)),
            asyncio.create_task(_every(FLUSH_S, self._flush)),
        ]
        code = await self.torchrun.wait()
        for task in periodic:
            task.cancel()
        await asyncio.gather(*periodic, return_exceptions=True)
        if self._stop_signal is not None:
            code = 128 + self._stop_signal
        await self.hub.finish(code, self._stop_signal)
        await self._print_summary()
        self.run.update_meta(state="finished" if code == 0 else "failed", ended=time.time(), exit_code=code)
        print(f"ddptop: job {'finished' if code == 0 else 'failed'} (exit {code}); run directory {self.run.path}", file=self.out, flush=True)
        return code

    def _on_signal(self, signum: int) -> None:
        """First signal: stop the job in order. A second: kill it now."""
        if self._stopping is None:
            print(f"ddptop: {signal.Signals(signum).name}: stopping the job", file=sys.stderr, flush=True)
        self._request_stop(signum)

    def _request_stop(self, signum: int) -> None:
        if self._stopping is None:
            self._stop_signal = signum
            self._stopping = asyncio.create_task(self.torchrun.stop())
        elif self.torchrun.proc is not None and self.torchrun.proc.returncode is None:
            self.torchrun.proc.kill()

    async def _sample(self) -> None:
        pids = {rank: state.pid for rank, state in self.state.ranks.items() if state.pid}
        self.record(await asyncio.to_thread(self.sampler.sample, pids))

    async def _record_totals(self) -> None:
        self.hub.record_totals()

    async def _print_summary(self) -> None:
        print(summary.line(self.state.totals(), time.time() - self.state.started), file=self.out, flush=True)

    async def _flush(self) -> None:
        self.hub.log.flush()


async def _every(period: float, action: Callable[[], Awaitable[None]]) -> None:
    """Call action every period seconds, measured from start to start."""
    loop = asyncio.get_running_loop()
    next_at = loop.time() + period
    while True:
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        next_at += period
        await action()
