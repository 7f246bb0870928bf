"""The run directory: metadata, the append-only event log, the attach socket.

Every run has one, private to its user (0700), so anything later — `ddptop
ls`, `export`, `replay`, `attach` — needs only its path. Runs created
elsewhere with --run-dir are linked from the default root so `ls` finds them.

    <run dir>/meta.json     id, script, ranks, state, times, exit code
    <run dir>/events.log    every record, as wire frames, appended (rotated: eventlog.py)
    <run dir>/sock          the supervisor's Unix socket (0600)
    <run dir>/token         the run's token for the wire over TCP (0600)
    <run dir>/logs/         torchrun's per-rank stdout/stderr files
    <run dir>/stacks/       Python stacks the ranks dumped when asked (hangs)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ddptop.core import wire
from ddptop.core.eventlog import read_all


def home() -> Path:
    """ddptop's per-user state root (DDPTOP_HOME overrides it, for tests)."""
    if "DDPTOP_HOME" in os.environ:
        return Path(os.environ["DDPTOP_HOME"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "ddptop"


def runs_root() -> Path:
    return home() / "runs"


class RunDirError(Exception):
    """A run directory that cannot be used; reported in one line."""


@dataclass
class RunDir:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def meta_path(self) -> Path:
        return self.path / "meta.json"

    @property
    def events_path(self) -> Path:
        return self.path / "events.log"

    @property
    def snapshot_path(self) -> Path:
        """The job's state as of a point in its log, for a replay to start from (model/snapshot.py)."""
        return self.path / "state.snapshot"

    @property
    def socket_path(self) -> Path:
        return self.path / "sock"

    @property
    def token_path(self) -> Path:
        return self.path / "token"

    @property
    def logs_path(self) -> Path:
        return self.path / "logs"

    @property
    def stacks_path(self) -> Path:
        """The stack dumps as read: the main thread's first, ddptop's own threads marked."""
        return self.path / "stacks"

    @property
    def raw_stacks_path(self) -> Path:
        """Where each rank's faulthandler writes its dumps as they come (trainer/runtime.py)."""
        return self.path / "stacks" / "raw"

    def read_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads(self.meta_path.read_text())
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Atomically: a reader never sees half a file."""
        tmp = self.meta_path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, self.meta_path)
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk: no half-written file left behind
            raise

    def state(self) -> str:
        """running, finished, stopped (by the user: Ctrl-C, SIGTERM, `ddptop stop`) or failed, as the job truly ended.

        meta.json says so once the job has ended, before the exit record goes
        out. A supervisor that died (or could not write meta.json) before
        saying so leaves it "running": the event log's last record tells, an
        `exit` record written when the job ended; without one, the job was
        lost with its supervisor: failed.
        """
        try:
            meta = self.read_meta()
        except (OSError, ValueError):
            meta = {"state": "running"}
        if meta.get("state") != "running" or _alive(meta.get("supervisor_pid"), meta.get("supervisor_started")):
            return str(meta.get("state", "failed"))
        try:
            with self.events_path.open("rb") as stream:
                last = wire.last_frame(stream)
        except (OSError, wire.FrameError):
            last = None
        if last is not None and last.get("type") == "exit":
            return "finished" if last.get("code") == 0 else "stopped" if last.get("stopped_by_signal") else "failed"
        return "failed"


def _alive(pid: Any, started: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        proc = psutil.Process(pid)
        return started is None or abs(proc.create_time() - float(started)) < 1.0
    except psutil.Error:
        return False


def single_node(meta: Mapping[str, Any]) -> bool:
    """Whether a run's job is one node's (its --nnodes as given: "1", or the range "1:1")."""
    return str(meta.get("nnodes", "1")) in ("1", "1:1")


def create(script: Path, chosen: Path | None) -> RunDir:
    """Make a fresh run directory (the chosen one, or a new one under the root)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{script.stem}-{secrets.token_hex(2)}"
    path = (chosen if chosen is not None else runs_root() / run_id).absolute()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=chosen is not None)
        if chosen is not None and any(path.iterdir()):
            raise RunDirError(f"run directory {path} is not empty")
        path.chmod(0o700)
        probe = path / ".probe"
        probe.write_bytes(b"")
        probe.unlink()
        (path / "logs").mkdir(mode=0o700)
        (path / "stacks" / "raw").mkdir(mode=0o700, parents=True)
        if chosen is not None:
            runs_root().mkdir(mode=0o700, parents=True, exist_ok=True)
            (runs_root() / f"{stamp}-{path.name}-{secrets.token_hex(2)}").symlink_to(path)
    except OSError as exc:
        raise RunDirError(f"cannot use run directory {path}: {exc.strerror or exc}") from None
    return RunDir(path)


def find(spec: str | None) -> RunDir:
    """A run by path, by id (or unique id prefix), or the newest when spec is None."""
    if spec is not None and Path(spec).is_dir() and (Path(spec) / "meta.json").exists():
        return RunDir(Path(spec).absolute())
    runs = list(all_runs())
    if spec is None:
        if not runs:
            raise RunDirError(f"no runs under {runs_root()}")
        return runs[-1]
    matches = [r for r in runs if r.id.startswith(spec) or r.path.name == spec]
    if len(matches) != 1:
        raise RunDirError(f"no run matches {spec!r}" if not matches else f"{spec!r} matches {len(matches)} runs")
    return matches[0]


def all_runs() -> Iterator[RunDir]:
    """Every run under the root (links resolved), oldest first by start time, each once: a
    --run-dir used again after its removal has two links, the old run's now leading to the new."""
    root = runs_root()
    if not root.is_dir():
        return iter(())
    runs = []
    seen: set[Path] = set()
    for entry in root.iterdir():
        path = entry.resolve()
        if path in seen:
            continue
        seen.add(path)
        run = RunDir(path)
        try:
            runs.append((run.read_meta().get("started", 0.0), run))
        except (OSError, ValueError):
            continue
    return iter(run for _, run in sorted(runs, key=lambda item: item[0]))


def read_events(run: RunDir) -> Iterator[wire.Record]:
    """Every record of the run, rotated segments included (eventlog.py)."""
    return read_all(run.events_path)


TAIL_BYTES = 64 << 10


def _tail(path: Path, lines: int) -> list[str]:
    """The last lines of a file, reading only its end: rank logs grow without bound. Each as a
    terminal leaves it (shown_line): a progress bar's hundreds of redraws are one line."""
    with path.open("rb") as stream:
        size = stream.seek(0, 2)
        stream.seek(max(0, size - TAIL_BYTES))
        text = stream.read().decode(errors="replace").split("\n")
    if text[-1] == "":  # the file ends its last line
        text.pop()
    if size > TAIL_BYTES and "\r" not in text[0].rstrip("\r"):  # read from inside it: kept where its last redraw is whole
        text.pop(0)
    return [shown_line(line) for line in text[-lines:]]


def shown_line(line: str) -> str:
    """What a terminal shows of a line that redrew itself: the part after its last carriage
    return (tqdm writes "\\r" and the whole bar at each update), a "\\r\\n" ending aside."""
    return line.rstrip("\r").rsplit("\r", 1)[-1]


def own_log_tail(run_dir: Path, launch_style: str, local_rank: int, restart: int, lines: int) -> list[str]:
    """The end of one rank's stdout and stderr in its attempt, read on its own node. A script
    that starts its own ranks runs as torchrun's one worker, whose log holds all of them."""
    return rank_log_tail(run_dir, local_rank if launch_style == "torchrun" else 0, restart, lines)


def _rank_logs(run_dir: Path, local_rank: int, restart: int, streams: tuple[str, ...]) -> list[tuple[float, str, Path]]:
    """A rank's output files of one attempt as torchrun keeps them: (mtime, stream, path), oldest first."""
    found: list[tuple[float, str, Path]] = []
    for stream in streams:
        for path in run_dir.glob(f"logs/*/attempt_{restart}/{local_rank}/{stream}.log"):
            with contextlib.suppress(OSError):
                found.append((path.stat().st_mtime, stream, path))
    return sorted(found)


def rank_log_written(run_dir: Path, local_rank: int, restart: int, streams: tuple[str, ...] = ("stdout", "stderr")) -> float | None:
    """When a rank last wrote to its output files of one attempt (their newest mtime), or None."""
    return max((written for written, _, _ in _rank_logs(run_dir, local_rank, restart, streams)), default=None)


def rank_log_tail(run_dir: Path, local_rank: int, restart: int, lines: int, streams: tuple[str, ...] = ("stdout", "stderr")) -> list[str]:
    """The end of a rank's output as torchrun kept it (one attempt's files), the file written
    last at the end: a view that shows the end follows the rank's latest output, not the
    warnings its stderr got at its start."""
    found = _rank_logs(run_dir, local_rank, restart, streams)
    out: list[str] = []
    for _, stream, path in found:
        out += [f"[{stream}] {line}" if len(streams) > 1 else line for line in _tail(path, lines)]
    return out
