"""Every PyTorch distributed job on this host, found from what the operating system shows.

Nothing is written into a job and nothing is asked of it: each process's
command line, environment (where it can be read), parent and state come
from /proc through psutil. A process is a rank when:

- its environment says so: RANK and WORLD_SIZE, as torchrun, accelerate,
  DeepSpeed and Lightning set them, or SLURM_PROCID and SLURM_NTASKS under
  srun. A child that carries its parent's RANK is that rank's own worker (a
  DataLoader's), not another rank;
- or torch.multiprocessing started it for a script that has torch loaded
  (`mp.spawn`): its rank is its place among its siblings, by start.

Ranks are grouped into jobs by what their launcher shares with all of
them: torchrun's run id and rendezvous address, SLURM's job and step, or
the spawning script; each job knows its launcher (the ranks' parent) when
it is one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from ddptop.core import launch_env

TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
"""The modules `python -m` runs as torchrun's agent (`torchrun` is the first's entry point)."""

SPAWN_MAIN = "multiprocessing.spawn import spawn_main"
"""In the command line of a process multiprocessing started with the spawn method."""

LAUNCHERS = {"torchrun": "torchrun", "accelerate": "accelerate", "deepspeed": "deepspeed", "srun": "srun", "slurmstepd": "srun"}
"""Words of a parent's command line that name the launcher of its ranks."""


@dataclass
class Rank:
    """One rank's process, as the system shows it."""

    pid: int
    rank: int
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    """Ranks on this node (torchrun's LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE)."""
    node: int | None
    """The node's rank in the job (torchrun's GROUP_RANK, SLURM_NODEID)."""
    status: str
    """psutil's: running, sleeping, disk-sleep, stopped, zombie..."""
    cpu_percent: float | None
    rss: int | None
    threads: int | None
    started: float
    cmdline: list[str]
    user: str | None


@dataclass
class Job:
    """The ranks one launcher started, in rank order."""

    key: tuple[Any, ...]
    launcher: str
    """torchrun, mp.spawn, srun, accelerate, deepspeed, ddptop, or "ranks" where no launcher is known."""
    launcher_pid: int | None
    command: list[str]
    """The launcher's command line, else the first rank's."""
    ranks: list[Rank] = field(default_factory=list)
    run_dir: str | None = None
    """The run directory of a job ddptop launched (its supervisor's socket's folder)."""

    @property
    def id(self) -> int:
        """How a user names the job: its launcher's pid, else its first rank's."""
        return self.launcher_pid if self.launcher_pid is not None else self.ranks[0].pid

    @property
    def world_size(self) -> int | None:
        return next((r.world_size for r in self.ranks if r.world_size is not None), None)

    @property
    def local_world_size(self) -> int | None:
        return next((r.local_world_size for r in self.ranks if r.local_world_size is not None), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "launcher": self.launcher,
            "launcher_pid": self.launcher_pid,
            "command": self.command,
            "world_size": self.world_size,
            "run_dir": self.run_dir,
            "ranks": [
                {
                    "rank": r.rank,
                    "local_rank": r.local_rank,
                    "node": r.node,
                    "pid": r.pid,
                    "status": r.status,
                    "cpu_percent": r.cpu_percent,
                    "rss": r.rss,
                    "threads": r.threads,
                    "user": r.user,
                }
                for r in self.ranks
            ],
        }


@dataclass
class Seen:
    """What one look at the host found: the jobs, and how many processes it could not read."""

    jobs: list[Job]
    unreadable: int = 0
    """Python processes whose environment another user's rights keep from us."""


@dataclass
class _Proc:
    pid: int
    ppid: int
    cmdline: list[str]
    env: Mapping[str, str] | None
    status: str
    started: float
    user: str | None
    rss: int | None
    threads: int | None
    handle: psutil.Process


def discover(cpu_interval: float | None = None) -> Seen:
    """The jobs on this host now. cpu_interval: seconds to measure each rank's CPU % over (None:
    since psutil last looked, which is nothing on a first look)."""
    procs, unreadable = _processes()
    by_pid = {p.pid: p for p in procs}
    jobs: dict[tuple[Any, ...], Job] = {}
    for proc in procs:
        found = _as_rank(proc, by_pid)
        if found is None:
            continue
        key, rank, launcher = found
        job = jobs.get(key)
        if job is None:
            parent = by_pid.get(proc.ppid)
            started_them = parent if parent is not None and _started_by(launcher) else None
            job = jobs[key] = Job(
                key,
                launcher,
                None if started_them is None else started_them.pid,
                proc.cmdline if started_them is None else started_them.cmdline,
                run_dir=_run_dir(proc.env),
            )
        job.ranks.append(rank)
    for job in jobs.values():
        if job.launcher == "mp.spawn":  # a spawned worker's rank is its place among its siblings
            job.ranks.sort(key=lambda r: (r.started, r.pid))
            for index, rank in enumerate(job.ranks):
                rank.rank = index
        job.ranks.sort(key=lambda r: (r.node or 0, r.rank, r.pid))
    if cpu_interval is not None:
        _measure_cpu([r for job in jobs.values() for r in job.ranks], by_pid, cpu_interval)
    return Seen(sorted(jobs.values(), key=lambda j: min(r.started for r in j.ranks)), unreadable)


def _processes() -> tuple[list[_Proc], int]:
    procs: list[_Proc] = []
    unreadable = 0
    attrs = ["pid", "ppid", "cmdline", "status", "create_time", "username", "memory_info", "num_threads"]
    for handle in psutil.process_iter(attrs):
        info = handle.info
        cmdline = info.get("cmdline") or []
        if not _pythonish(cmdline):
            continue
        try:
            env: Mapping[str, str] | None = handle.environ()
        except psutil.AccessDenied:
            env, unreadable = None, unreadable + 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess):  # gone since the listing
            continue
        memory = info.get("memory_info")
        procs.append(
            _Proc(
                info["pid"],
                info.get("ppid") or 0,
                cmdline,
                env,
                info.get("status") or "?",
                info.get("create_time") or 0.0,
                info.get("username"),
                memory.rss if memory is not None else None,
                info.get("num_threads"),
                handle,
            )
        )
    return procs, unreadable


def _pythonish(cmdline: list[str]) -> bool:
    """A Python process, or a launcher's entry point (torchrun, accelerate, deepspeed are Python too)."""
    if not cmdline:
        return False
    first = os.path.basename(cmdline[0])
    return first.startswith("python") or first in ("torchrun", "accelerate", "deepspeed") or any(m in cmdline for m in TORCHRUN_MODULES)


def is_torchrun(cmdline: list[str]) -> bool:
    return any(m in cmdline for m in TORCHRUN_MODULES) or any(os.path.basename(a) == "torchrun" for a in cmdline[:2])


def _as_rank(proc: _Proc, by_pid: Mapping[int, _Proc]) -> tuple[tuple[Any, ...], Rank, str] | None:
    """The job key, the rank and its launcher's kind, where proc is a rank; None where it is not."""
    if is_torchrun(proc.cmdline) or any("multiprocessing.resource_tracker" in a for a in proc.cmdline):
        return None
    env = proc.env or {}
    parent = by_pid.get(proc.ppid)
    spawned = any(SPAWN_MAIN in a for a in proc.cmdline)
    rank_word = env.get("RANK", env.get("SLURM_PROCID"))
    world_word = env.get("WORLD_SIZE", env.get("SLURM_NTASKS"))
    if rank_word is not None and world_word is not None and rank_word.isdigit():
        if parent is not None and parent.env is not None and parent.env.get("RANK", parent.env.get("SLURM_PROCID")) == rank_word:
            return None  # its rank's own worker (a DataLoader's), which inherited its variables
        if "RANK" not in env and not _has_torch(proc.pid):
            return None  # an srun task that is no PyTorch process
        key = _env_key(env)
        local = env.get("LOCAL_RANK", env.get("SLURM_LOCALID"))
        local_world = env.get("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE"))
        node = env.get("GROUP_RANK", env.get("SLURM_NODEID"))
        return key, _rank(proc, int(rank_word), local, world_word, local_world, node), _launcher(parent, env)
    if spawned and parent is not None and not _is_rank_env(parent.env) and _has_torch(parent.pid):
        return ("spawn", parent.pid), _rank(proc, 0, None, None, None, None), "mp.spawn"
    return None


def _is_rank_env(env: Mapping[str, str] | None) -> bool:
    return env is not None and ("RANK" in env or "SLURM_PROCID" in env)


def _env_key(env: Mapping[str, str]) -> tuple[Any, ...]:
    """What every rank of one job shares: torchrun's run id and rendezvous, else SLURM's job and step."""
    if "SLURM_JOB_ID" in env and "TORCHELASTIC_RUN_ID" not in env:
        return ("slurm", env["SLURM_JOB_ID"], env.get("SLURM_STEP_ID"), env.get("MASTER_ADDR"), env.get("MASTER_PORT"))
    return ("env", env.get("TORCHELASTIC_RUN_ID"), env.get("MASTER_ADDR"), env.get("MASTER_PORT"), env.get("WORLD_SIZE"))


def _launcher(parent: _Proc | None, env: Mapping[str, str]) -> str:
    if launch_env.ADDRESS in env:
        return "ddptop"
    if parent is not None:
        if is_torchrun(parent.cmdline):
            return "torchrun"
        words = " ".join(os.path.basename(a) for a in parent.cmdline[:3])
        for word, launcher in LAUNCHERS.items():
            if word in words:
                return launcher
    return "srun" if "SLURM_PROCID" in env else "ranks"


def _started_by(launcher: str) -> bool:
    """Whether the ranks' parent is their launcher, whose command line and pid stand for the job:
    under srun it is slurmstepd, a process of no command line of interest (the job is its ranks)."""
    return launcher not in ("ranks", "srun")


def _run_dir(env: Mapping[str, str] | None) -> str | None:
    address = (env or {}).get(launch_env.ADDRESS)
    return os.path.dirname(address) if address and address.startswith("/") else None


def _rank(proc: _Proc, rank: int, local: str | None, world: str | None, local_world: str | None, node: str | None) -> Rank:
    return Rank(
        proc.pid,
        rank,
        _number(local),
        _number(world),
        _number(local_world),
        _number(node),
        proc.status,
        None,
        proc.rss,
        proc.threads,
        proc.started,
        proc.cmdline,
        proc.user,
    )


def _number(word: str | None) -> int | None:
    return int(word) if word and word.isdigit() else None


def _has_torch(pid: int) -> bool:
    """Whether the process has PyTorch's library loaded (its memory maps name libtorch)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any("libtorch" in line for line in maps)
    except OSError:
        return False


def _measure_cpu(ranks: Iterable[Rank], by_pid: Mapping[int, _Proc], interval: float) -> None:
    """Each rank's CPU % over interval, all measured over the same span."""
    handles = {r.pid: by_pid[r.pid].handle for r in ranks}
    for handle in handles.values():
        with contextlib.suppress(psutil.Error):
            handle.cpu_percent(None)
    time.sleep(interval)
    for rank in ranks:
        try:
            rank.cpu_percent = handles[rank.pid].cpu_percent(None)
        except psutil.Error:
            rank.cpu_percent = None
