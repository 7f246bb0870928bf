"""A job ddptop did not launch, told over the wire as if a supervisor watched it.

`python -m ddptop.supervisor.outside.watch JOB RUN_DIR` serves a hub on
RUN_DIR's socket, so the dashboard attaches to it as to any supervisor (the
dashboard never imports the supervisor). About once a second it looks at the
job from outside: its ranks' processes (discovery.py), their CPU, memory and
GPU (the sampler), and, spread over the ranks, where each one is (looks.py,
py-spy in non-blocking mode, each rank at most every LOOK_EVERY_S). It tells
each rank's hello once, then heartbeats with its state and place, samples,
and the judge's verdicts as alerts. It writes nothing into the job and
sends it no signal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddptop.core.rundir import RunDir
from ddptop.core.stack_groups import UNREADABLE
from ddptop.core.wire import records
from ddptop.supervisor.outside import looks
from ddptop.supervisor.outside.discovery import Job, discover
from ddptop.supervisor.outside.judge import Judge
from ddptop.supervisor.sampler import Sampler, load_nvml
from ddptop.supervisor.serving.hub import Hub
from ddptop.supervisor.watching.stacks import py_spy

LOOK_S = 1.0
"""How often the job's processes are read, and a share of its ranks' stacks."""
REDISCOVER_S = 5.0
"""How often the whole system is searched for the job's ranks (a rank restarted, or started late)."""
LOOK_EVERY_S = 2.0
"""How often, at most, one rank's stack is read: a look reads the ranks whose turn it is."""
STATE_WORDS = {"disk-sleep": "disk wait", "tracing-stop": "stopped", "dead": "gone"}
"""psutil's state names the rank table shows otherwise (running, sleeping, stopped, zombie)."""
HELD_SHOWN_S = 5.0
"""A rank in one place this long has its time there beside it in WHERE: "train.py:88 in load (42 s)"."""
NO_STEPS = "step times, loss and grad norm are not seen from outside"


def script_of(job: Job) -> list[str]:
    """The job's script and the script's own arguments, from its launcher's command line
    (a `-m module` where it runs a module)."""
    words = job.command
    start = next((i for i, word in enumerate(words) if word.endswith(".py") and i > 0), None)
    module = next((i for i, word in enumerate(words[:-1]) if word == "-m" and not words[i + 1].startswith("torch.distributed")), None)
    if start is None and module is not None:
        start = module
    return words[start:] if start is not None else words[-1:]


def launch_command(job: Job) -> str:
    """The `ddptop launch` command that runs this job with every figure: its script, the
    script's own arguments and its ranks on this node."""
    ranks = job.local_world_size or len(job.ranks)
    return shlex.join(["ddptop", "launch", "--gpus", str(ranks), *script_of(job)])


@dataclass
class Look:
    """What one look read of the job."""

    job: Job
    sample: records.Sample
    places: dict[int, looks.Place | None]
    """pid -> where the rank is, of the ranks read this look (None: py-spy could not read it)."""
    read: set[int]
    now: float


class Watch:
    """One job's looks, told to the hub."""

    def __init__(self, hub: Hub, job: Job, sampler: Sampler) -> None:
        self.hub, self.key, self.sampler, self.judge = hub, job.key, sampler, Judge()
        self.hello: dict[int, int] = {}
        """pid -> rank, of the ranks whose hello was told."""
        self.looked: dict[int, float] = {}
        """pid -> when its stack was last read."""
        self.stacks: dict[int, list[str]] = {}
        """pid -> the stack its last heartbeat carried (a heartbeat carries one when it changed)."""
        self.dumping: asyncio.Task[None] | None = None
        """Every rank's stacks being read, at a dashboard's asking (kept, so that the task runs to its end)."""
        self.said_unread = False
        """Whether the notice of a rank py-spy cannot read was given: once for the job."""
        self.read_one = False
        """Whether py-spy has read any rank of the job: then one it cannot read is a passing failure."""
        self.job: Job | None = None
        self.discovered = 0.0
        """When the system was last searched for the job's ranks."""

    def start(self, job: Job) -> None:
        script = script_of(job)
        run: records.Run = {
            "type": "run",
            "wall": time.time(),
            "id": self.hub.run.id,
            "script": script[0],
            "args": script[1:],
            "launch_style": records.OUTSIDE,
            "launch_reason": f"started by {job.launcher}, watched from outside",
        }
        self.hub.record(run)
        self.hub.note(f"job {job.id}, {job.launcher}: watched from outside. {NO_STEPS}: {launch_command(job)} gives them")

    def gather(self) -> Look | None:
        """Read the job off the system, on a thread of its own (py-spy's reads take a while);
        None once the job is gone."""
        now = time.time()
        job = self._job(now)
        if job is None:
            return None
        sample = self.sampler.sample({r.rank: r.pid for r in job.ranks})
        read = {proc["pid"]: proc for proc in sample["procs"]}
        for rank in job.ranks:
            rank.cpu_percent, rank.rss = read[rank.pid].get("cpu"), read[rank.pid].get("rss", rank.rss)
        due = self._due(job, now)
        return Look(job, sample, looks.each(looks.look, due), set(due), now)

    def tell(self, look: Look | None) -> bool:
        """What a look found, to the hub (on its loop); False once the job is gone."""
        now = time.time() if look is None else look.now
        gone = set(self.hello) - (set() if look is None else {r.pid for r in look.job.ranks})
        for pid in sorted(gone):
            self.hub.record({"type": "rank_gone", "rank": self.hello.pop(pid), "wall": now})
        if look is None:
            return False
        job = look.job
        world = job.world_size or len(job.ranks)
        for rank in job.ranks:
            if rank.pid not in self.hello:
                self.hello[rank.pid] = rank.rank
                hello: records.RankHello = {
                    "type": "rank_hello",
                    "rank": rank.rank,
                    "local_rank": rank.local_rank if rank.local_rank is not None else rank.rank,
                    "world_size": world,
                    "node": rank.node or 0,
                    "host": "",
                    "pid": rank.pid,
                    "restart": 0,
                    "started": rank.started,
                }
                self.hub.record(hello)
        self.hub.record(look.sample)
        # A busy rank's read can fail now and then: py-spy is kept out (ptrace refused, not
        # installed) only where no rank of the job was ever read.
        self.read_one = self.read_one or any(place is not None for place in look.places.values())
        unread = [r for r in job.ranks if r.pid in look.read and look.places.get(r.pid) is None and r.status != "zombie"]
        if unread and not self.read_one and not self.said_unread:
            self.said_unread = True
            self.hub.note(unreadable(unread[0].rank, unread[0].pid))
        verdicts = self.judge.observe(job, look.places, now)
        for rank in job.ranks:
            self._heartbeat(rank.rank, rank.pid, rank.status, look.places.get(rank.pid), rank.pid in look.read)
        for verdict in verdicts:
            alert: records.Alert = {
                "type": "alert",
                "wall": now,
                "kind": verdict.kind,
                "ranks": verdict.ranks,
                "text": verdict.text,
                "action": "none",  # told, never acted on: ddptop does not own this job
            }
            if len(verdict.ranks) == 1:
                alert["rank"] = verdict.ranks[0]
            self.hub.record(alert)
        return True

    def _job(self, now: float) -> Job | None:
        """The job now: every REDISCOVER_S from the whole system (a rank started since), and in
        between its known ranks' states alone (reading every process's environment each second
        cost the job a share of a core on a small host)."""
        if self.job is None or now - self.discovered >= REDISCOVER_S:
            self.discovered = now
            self.job = next((j for j in discover().jobs if j.key == self.key), None)
            return self.job
        ranks = []
        for rank in self.job.ranks:
            with contextlib.suppress(psutil.Error):  # gone: the next look tells it
                ranks.append(dataclasses.replace(rank, status=psutil.Process(rank.pid).status()))
        self.job = dataclasses.replace(self.job, ranks=ranks) if ranks else None
        return self.job

    def _due(self, job: Job, now: float) -> list[int]:
        """The ranks whose stack is read this look: those not read for LOOK_EVERY_S, at most a
        share that reads every rank once in LOOK_EVERY_S."""
        share = max(1, math.ceil(len(job.ranks) * LOOK_S / LOOK_EVERY_S))
        due = sorted((r.pid for r in job.ranks if now - self.looked.get(r.pid, 0.0) >= LOOK_EVERY_S), key=lambda p: self.looked.get(p, 0.0))
        for pid in due[:share]:
            self.looked[pid] = now
        return due[:share]

    def _heartbeat(self, rank: int, pid: int, status: str, place: looks.Place | None, read: bool) -> None:
        """A rank not read this look keeps the place its last heartbeat told."""
        beat: records.Heartbeat = {
            "type": "heartbeat",
            "rank": rank,
            "wall": time.time(),
            "phase": STATE_WORDS.get(status, status),
            "step": 0,
            "dropped": 0,
        }
        if place is not None:
            since = self.judge.since(pid)
            held = 0.0 if since is None else beat["wall"] - since
            beat["where"] = (place.where or "library code") + (f" ({held:.0f} s)" if held >= HELD_SHOWN_S else "")
            if place.inside is not None:
                beat["inside"] = place.inside
            stack = list(reversed(place.stack))  # a heartbeat's stack is outermost first
            if stack != self.stacks.get(pid):
                self.stacks[pid] = beat["stack"] = stack
        elif read:
            beat["where"] = "(py-spy could not read it)"
        self.hub.record(beat)


def unreadable(rank: int, pid: int) -> str:
    """Why WHERE is missing for a rank, and how to allow it, in one line."""
    if py_spy() is None:
        return "py-spy is not installed: WHERE cannot be read from outside (pip install py-spy)"
    return (
        f"py-spy could not read rank {rank} (pid {pid}): reading another process's stacks needs the same user, "
        "or CAP_SYS_PTRACE; where yama's ptrace_scope is 1 or more, `sudo sysctl kernel.yama.ptrace_scope=0` allows it"
    )


NO_LOG = "(ddptop did not launch this job: its ranks' output goes where its launcher sent it)"


def answer(hub: Hub, watcher: Watch, command: records.Command) -> None:
    """What a dashboard asks of this watch: a rank's log tail, which it has none of; every rank's
    stacks, read in non-blocking mode (the ranks are not held still) and told as they come."""
    if command["action"] == "log_tail" and "rank" in command:
        hub.record({"type": "log_tail", "rank": command["rank"], "wall": time.time(), "restart": 0, "lines": [NO_LOG]})
    elif command["action"] == "stacks" and watcher.job is not None:
        ranks = {r.pid: r.rank for r in watcher.job.ranks}
        watcher.dumping = asyncio.get_running_loop().create_task(dump_stacks(hub, ranks))


async def dump_stacks(hub: Hub, ranks: dict[int, int]) -> None:
    """Every rank's threads, py-spy's full dump, as stack records."""
    dumps = await asyncio.to_thread(looks.each, looks.dump, list(ranks))
    for pid, text in dumps.items():
        said = text if text is not None else UNREADABLE
        hub.record({"type": "stack", "rank": ranks[pid], "wall": time.time(), "source": "py-spy --nonblocking", "text": said})


async def watch(job_id: int, run_dir: Path) -> int:
    job = next((j for j in discover().jobs if j.id == job_id), None)
    if job is None:
        print(f"ddptop: no PyTorch distributed job {job_id} on this host", file=sys.stderr)
        return 1
    run = RunDir(run_dir)
    hub = Hub(run, lambda command: answer(hub, watcher, command))
    await hub.start()
    watcher = Watch(hub, job, Sampler(load_nvml()))
    watcher.start(job)
    while watcher.tell(await asyncio.to_thread(watcher.gather)):
        hub.flush()
        await asyncio.sleep(LOOK_S)
    hub.note(f"job {job_id} has ended: none of its ranks runs")
    hub.flush()
    await asyncio.Event().wait()  # the dashboard reads on until it closes, and then ends this process
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ddptop.supervisor.outside.watch")
    parser.add_argument("job", type=int)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    # The job comes first: on a host its ranks keep busy, the watch and its py-spy reads take
    # only the CPU they leave (the children inherit the priority).
    with contextlib.suppress(OSError):
        os.nice(19)
    raise SystemExit(asyncio.run(watch(args.job, args.run_dir)))


if __name__ == "__main__":
    main()
