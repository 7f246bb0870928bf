"""One supervised job: torchrun child, collector, sampler, event log, summaries.

Everything runs on one asyncio loop in the supervisor process; the only
blocking calls (NVML and psutil) run in a worker thread. Every record,
whether from a rank or made here, goes through `record()`: into the event
log first, then into the job state, so the log is the full story a later
replay or export reads.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from ddptop.supervisor import summary
from ddptop.supervisor.collector import Collector
from ddptop.supervisor.jobstate import JobState
from ddptop.supervisor.launcher import Torchrun
from ddptop.supervisor.rundir import EventLog, RunDir
from ddptop.supervisor.sampler import Sampler
from ddptop.trainer import wire

SAMPLE_S = 1.0
FLUSH_S = 1.0


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
        self.state = JobState()
        self.log = EventLog(run.events_path)
        self.collector = Collector(self.record)
        self._stop_signal: int | None = None
        self._stopping: asyncio.Task | None = None

    def record(self, frame: wire.Frame) -> None:
        self.log.append(frame)
        self.state.ingest(frame)

    async def main(self, meta: dict[str, Any]) -> int:
        """Run the job to its end; return the exit status for `ddptop launch`."""
        loop = asyncio.get_running_loop()
        await self.collector.start_unix(self.run.socket_path)
        self.record({"type": "run", **meta})
        await self.torchrun.start()
        self.run.update_meta(torchrun_pid=self.torchrun.pid)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, self._on_signal, signum)
        periodic = [
            asyncio.create_task(_every(SAMPLE_S, self._sample)),
            asyncio.create_task(_every(self.summary_every, self._summarise)),
            asyncio.create_task(_every(FLUSH_S, self._flush)),
        ]
        code = await self.torchrun.wait()
        await self.collector.close()
        for task in periodic:
            task.cancel()
        await asyncio.gather(*periodic, return_exceptions=True)
        if self._stop_signal is not None:
            code = 128 + self._stop_signal
        await self._summarise()
        self.record({"type": "exit", "wall": time.time(), "code": code, "stopped_by_signal": self._stop_signal})
        self.log.close()
        self.run.update_meta(state="finished" if code == 0 else "failed", ended=time.time(), exit_code=code)
        print(f"ddptop: job {'finished' if code == 0 else 'failed'} (exit {code}); run directory {self.run.path}", file=self.out, flush=True)
        return code

    def _on_signal(self, signum: int) -> None:
        """First signal: stop the job in order. A second: kill it now."""
        if self._stopping is None:
            self._stop_signal = signum
            print(f"ddptop: {signal.Signals(signum).name}: stopping the job", file=sys.stderr, flush=True)
            self._stopping = asyncio.create_task(self.torchrun.stop())
        elif self.torchrun.proc is not None and self.torchrun.proc.returncode is None:
            self.torchrun.proc.kill()

    async def _sample(self) -> None:
        pids = {rank: state.pid for rank, state in self.state.ranks.items() if state.pid}
        self.record(await asyncio.to_thread(self.sampler.sample, pids))

    async def _summarise(self) -> None:
        totals = self.state.totals()
        self.record({"type": "summary", "wall": time.time(), **totals})
        print(summary.line(totals, time.time() - self.state.started), file=self.out, flush=True)

    async def _flush(self) -> None:
        self.log.flush()


async def _every(period: float, action: Callable[[], Awaitable[None]]) -> None:
    """Call action every period seconds, measured from start to start."""
    loop = asyncio.get_running_loop()
    next_at = loop.time() + period
    while True:
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        next_at += period
        await action()
