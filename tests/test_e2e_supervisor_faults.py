"""The supervisor's own environment failing under a real job: a full disk, a removed run directory,
a closed stdout, a dashboard that stops reading. Each: the job's own exit status, the run's true
state, one notice, no traceback."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import DDPTOP, SCRIPTS, recorded, run_ddptop, until, wait_for
from synthetic import synthetic_job

from ddptop.core import rundir, wire
from ddptop.core.eventlog import EventLog
from ddptop.core.wire.stream import frames
from ddptop.supervisor.serving.hub import Hub
from ddptop.supervisor.serving.viewers import QUEUE_MAX

pytestmark = pytest.mark.slow

WEATHER = SCRIPTS / "disk_weather.py"


def headless(run_path: Path, script: Path, *args: str) -> list[str]:
    """`ddptop launch --headless` of script on 2 ranks, as a user types it."""
    return [DDPTOP, "launch", "--headless", "--run-dir", str(run_path), str(script), "--gpus", "2", *args]


def mount_namespace() -> list[str]:
    """A command prefix that runs in a mount namespace of its own, where a tmpfs may be mounted:
    as root, or as a user where user namespaces are allowed. The test skips where neither is."""
    for prefix in (["unshare", "-m"], ["unshare", "-Urm"]):
        if shutil.which(prefix[0]) is None:
            break
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    pytest.skip("cannot mount a small filesystem here (needs root or user namespaces)")


def test_a_disk_full_from_the_start_then_filling_again_mid_run(tmp_path):
    """A 1 MiB tmpfs, full before launch; rank 0 frees it at step 100, fills it at 200, frees it at 300."""
    fs, out = tmp_path / "fs", tmp_path / "out"
    fs.mkdir()
    out.mkdir()
    script = f"""
set -u
mount -t tmpfs -o size=1m tmpfs {fs}
dd if=/dev/zero of={fs}/filler bs=4k 2>/dev/null
export DDPTOP_HOME={fs}/home
{DDPTOP} launch --headless --run-dir {fs}/run {WEATHER} --gpus 2 --filler {fs}/filler \
    --free-at 100 --fill-at 200 --free-at 300 --steps 400 > {out}/stdout 2> {out}/stderr
echo $? > {out}/rc
{DDPTOP} ls --json > {out}/ls.json
cp -r {fs}/run {out}/run
"""
    done = subprocess.run([*mount_namespace(), "sh", "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    stderr = (out / "stderr").read_text()
    assert (out / "rc").read_text().strip() == "0", stderr[-3000:]
    assert "Traceback" not in stderr
    for line in (
        "ddptop: cannot write the token file (No space left on device)",
        "ddptop: cannot write meta.json (No space left on device)",
        "ddptop: cannot write the event log (No space left on device)",
        "ddptop: writing the event log again, after",
        "ddptop: writing meta.json again, after",
    ):
        assert line in stderr, line
    assert stderr.count("cannot write the event log") == 2  # once per outage, not once per write

    [listed] = json.loads((out / "ls.json").read_text())
    assert listed["state"] == "finished"
    run = rundir.RunDir(out / "run")
    assert run.read_meta()["exit_code"] == 0
    records = recorded(run)
    gaps = [r["text"] for r in records if r["type"] == "notice" and r["text"].startswith("event log gap:")]
    assert len(gaps) == 2 and all("were not written (No space left on device)" in gap for gap in gaps), gaps
    steps = sorted({r["step"] for r in records if r["type"] == "step" and r["rank"] == 0})
    assert 399 in steps and 150 in steps and len(steps) < 400  # logged while there was room, and only then
    assert records[-1]["type"] == "exit" and records[-1]["code"] == 0


def test_the_run_directory_removed_mid_run(ddptop_home, tmp_path):
    run_path = tmp_path / "run"
    proc = subprocess.run(
        headless(run_path, WEATHER, "--remove-run-at", "50", "--steps", "150"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not run_path.exists()
    assert "Traceback" not in proc.stderr
    assert "ddptop: cannot write meta.json (No such file or directory)" in proc.stderr
    assert "ddptop: job finished (exit 0)" in proc.stdout
    listed = run_ddptop("ls", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []  # nothing left to list, and no error


def test_a_closed_stdout_loses_the_summaries_not_the_job(ddptop_home, tmp_path):
    """`ddptop launch --headless ... | head -1`: the reader goes away after the first line."""
    run_path = tmp_path / "run"
    proc = subprocess.Popen(
        headless(run_path, WEATHER, "--steps", "200", "--summary-every", "0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=240) == 0, stderr[-3000:]
    assert first.startswith("ddptop ")
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert stderr.count("ddptop: cannot write stdout (Broken pipe)") == 1
    run = rundir.RunDir(run_path)
    assert run.state() == "finished" and run.read_meta()["exit_code"] == 0
    records = recorded(run)
    assert [r["text"] for r in records if r["type"] == "notice" and "stdout" in r["text"]] == [
        "cannot write stdout (Broken pipe): dropped from now on; the job and its watching go on"
    ]
    assert {r["step"] for r in records if r["type"] == "step"} == set(range(200))


def test_ls_takes_the_outcome_from_the_exit_record_when_the_supervisor_could_not_say(ddptop_home, tmp_path):
    """meta.json still says running and its supervisor is gone: the event log's last record decides."""
    for name, last in (("ended", {"type": "exit", "wall": 0.0, "code": 0}), ("lost", {"type": "summary", "wall": 0.0, "metrics": {}})):
        run = rundir.create(Path("train.py"), tmp_path / name)
        run.write_meta({"id": name, "script": "train.py", "state": "running", "started": time.time(), "supervisor_pid": 2**22 + 1})
        log = EventLog(run.events_path)
        log.append({"type": "run", "wall": 0.0})
        log.append(last)
        log.close()
    assert rundir.RunDir(tmp_path / "ended").state() == "finished"
    assert rundir.RunDir(tmp_path / "lost").state() == "failed"


async def test_a_dashboard_that_stops_reading_is_dropped_and_the_others_go_on(tmp_path):
    """1,024 synthetic ranks; one viewer never reads, another does: the first is cut off with a notice."""
    run = rundir.create(Path("synthetic.py"), tmp_path / "run")
    hub = Hub(run, lambda command: None)
    await hub.start()
    _, stalled = await asyncio.open_unix_connection(str(run.socket_path))
    stalled.write(wire.encode({"type": "viewer_hello", "history": False}))
    reader, writer = await asyncio.open_unix_connection(str(run.socket_path))
    writer.write(wire.encode({"type": "viewer_hello", "history": False}))
    await asyncio.gather(stalled.drain(), writer.drain())
    received = 0

    async def read() -> None:
        nonlocal received
        async for _ in frames(reader, 1 << 16):
            received += 1

    reading = asyncio.create_task(read())
    job = asyncio.create_task(synthetic_job(run.socket_path, 1024, 10.0, steps=40))
    await until(lambda: any("dropped a dashboard" in e.get("text", "") for e in hub.state.events), "the stalled dashboard dropped", 90)
    assert hub.viewers.attached == 1
    await until(lambda: received >= QUEUE_MAX, "the reading dashboard still served", 60)
    sent = await asyncio.wait_for(job, 120)
    assert sent == [40] * 1024
    await hub.finish(0)
    await asyncio.wait_for(reading, 30)  # the reading dashboard got the end of the stream
    stalled.close()
    writer.close()


def test_sighup_is_the_terminal_gone_and_the_job_goes_on(ddptop_home, tmp_path):
    """An ssh session dropped under --headless: SIGINT and SIGTERM stop the job (test_e2e_restart.py), SIGHUP does not."""
    run = rundir.RunDir(tmp_path / "run")
    proc = subprocess.Popen(
        headless(run.path, WEATHER, "--steps", "300"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: run.events_path.exists() and any(r["type"] == "step" for r in rundir.read_events(run)), 120, "a first step")
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"ddptop: SIGHUP: the terminal is gone; the job goes on (SIGTERM to pid {proc.pid} stops it)" in stderr
    records = recorded(run)
    assert {r["step"] for r in records if r["type"] == "step"} == set(range(300))
    assert records[-1]["type"] == "exit" and records[-1]["code"] == 0


def test_a_rank_that_floods_records_is_bounded_and_counted_and_starves_nothing(ddptop_home, tmp_path):
    run = rundir.RunDir(tmp_path / "run")
    proc = subprocess.run(
        headless(run.path, SCRIPTS / "flood.py"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout
    records = recorded(run)
    dropped = max(r["dropped"] for r in records if r["type"] == "heartbeat" and r["rank"] == 0)
    logged = sum(1 for r in records if r["type"] == "step" and r["rank"] == 0)
    assert dropped > 0 and logged + dropped <= 200_000 < logged + dropped + 8192 + 4096  # each call: logged, dropped or queued at exit
    assert sum(1 for r in records if r["type"] == "heartbeat" and r["rank"] == 1) >= 1  # the other rank was still heard
    assert records[-1]["type"] == "exit" and records[-1]["code"] == 0
