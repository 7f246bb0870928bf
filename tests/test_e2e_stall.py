"""Stalls named in seconds with default settings, and pauses that are no stall: real gloo jobs of scripts
written the way trainers are (tests/scripts/stuck_loader.py, eval_pause.py, slow_checkpoint.py)."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from support import DDPTOP, SCRIPTS, counts_storage_bytes, recorded, wait_for

from ddptop.core import rundir
from ddptop.supervisor.watching.rules.stall import STALL_MIN_S

pytestmark = pytest.mark.slow


def line_of(script: Path, marker: str) -> int:
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if marker in line)


def test_a_rank_stuck_in_its_data_loader_is_named_at_its_line_within_the_window(ddptop_home, tmp_path):
    """No --hang-timeout given: the default 300 s would restart; the stall verdict comes in seconds."""
    script = SCRIPTS / "stuck_loader.py"
    run = rundir.RunDir(tmp_path / "run")
    mark = tmp_path / "stuck-at"
    proc = subprocess.Popen(
        [DDPTOP, "launch", "--headless", "--run-dir", str(run.path), str(script), "--gpus", "3", "--mark", str(mark)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        alerts = wait_for(
            lambda: [r for r in rundir.read_events(run) if r["type"] == "alert"] if run.events_path.exists() else [],
            timeout=120,
            what="the stall alert",
            interval=0.2,
        )
        # The alert is told first, then py-spy dumps each rank (seconds on a loaded machine).
        wait_for(
            lambda: len({r["rank"] for r in rundir.read_events(run) if r["type"] == "stack"}) == 3,
            timeout=60,
            what="the three ranks' stacks",
            interval=0.2,
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    [stall] = alerts
    assert stall["kind"] == "stall" and stall["action"] == "none" and stall["ranks"] == [1], stall
    loader_line = line_of(script, "# stuck here")
    backward_line = line_of(script, "loss.backward()")
    # The seconds said are those seen when the tick came: the window, or a second more on a loaded machine.
    said = re.sub(r"\b(?:1[5-9]) s\b", f"{STALL_MIN_S:.0f} s", stall["text"])
    assert said.startswith(
        f"no step for {STALL_MIN_S:.0f} s: ranks 0,2 wait in all-reduce at stuck_loader.py:{backward_line} in main, after step 29; "
        f"rank 1 stuck {STALL_MIN_S:.0f} s in data at stuck_loader.py:{loader_line} in __getitem__, after step 29; "
    ), stall["text"]
    # The flight recorder (on for gloo too): rank 1 never entered step 30's all-reduce.
    [(ahead, behind, stacks)] = re.findall(
        r"default group: ranks 0,2 in all_reduce #(\d+) \([\d.]+ KiB\); rank 1 never entered it, its last: all_reduce #(\d+); stacks in (.+)$",
        stall["text"],
    )
    assert int(ahead) == int(behind) + 1 and stacks == str(run.stacks_path)
    onset = float(mark.read_text())
    assert stall["wall"] - onset < stall["window_s"] + 5  # heartbeats and ticks add about two seconds
    assert f"ALERT stall: {stall['text']}" in stderr

    records = recorded(run)
    dumps = {r["rank"]: r["text"] for r in records if r["type"] == "stack"}
    assert sorted(dumps) == [0, 1, 2]
    # py-spy's dump (a dependency), the main thread first: its innermost script frame is the loader's line.
    main_thread = next(block for block in dumps[1].split("\n\n") if block.startswith("Thread "))
    assert '"MainThread"' in main_thread and re.search(rf"__getitem__ \(\S*stuck_loader\.py:{loader_line}\)", main_thread), dumps[1]
    assert "[ddptop's own thread]" in dumps[1]
    [kept] = run.stacks_path.glob("rank1.*.txt")
    assert kept.read_text().startswith("--- py-spy --native\nProcess ")


def test_rank_0_evaluating_alone_for_40_s_is_a_pause_with_no_alert(ddptop_home, tmp_path):
    script = SCRIPTS / "eval_pause.py"
    run = rundir.RunDir(tmp_path / "run")
    proc = subprocess.run(
        [DDPTOP, "launch", "--headless", "--run-dir", str(run.path), str(script), "--gpus", "3"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = recorded(run)
    assert [r for r in records if r["type"] == "alert"] == []
    assert re.search(r"step 100: val loss [\d.]+", proc.stdout)
    notes = [r["text"] for r in records if r["type"] == "notice" and "wait for" in r["text"]]
    # Where rank 0 was when the note was made: one of the evaluation loop's lines, as it happened.
    [note] = notes
    assert re.fullmatch(r"ranks 1,2 wait for rank 0, evaluating at eval_pause\.py:(\d+) in estimate_loss", note), note
    steps = [r for r in records if r["type"] == "step"]
    assert {(r["rank"], r["step"]) for r in steps} == {(rank, n) for rank in range(3) for n in range(150)}
    # Its last line does not call the evaluation stalled, having said it was a pause.
    [goodput] = [r["goodput"] for r in records if r["type"] == "exit"]
    assert goodput["stalled_s"] == 0.0 and goodput["paused_s"] > 35.0, goodput
    assert re.search(r"ddptop: goodput \d+% of .*; lost: .*paused \d+ s", proc.stdout + proc.stderr)


def test_rank_0_writing_a_checkpoint_to_slow_storage_for_25_s_is_a_pause_with_no_alert(ddptop_home, tmp_path):
    """Asleep in the kernel between writes, its CPU idle and its stack on one line, rank 0 still
    moves its pages out: it is checkpointing, not stuck, and the others wait for it."""
    if not counts_storage_bytes(tmp_path):
        pytest.skip("this kernel does not count a process's storage bytes")
    script = SCRIPTS / "slow_checkpoint.py"
    run = rundir.RunDir(tmp_path / "run")
    checkpoint = tmp_path / "ckpt.pt"
    proc = subprocess.run(
        [DDPTOP, "launch", "--headless", "--run-dir", str(run.path), str(script), "--gpus", "2", "--", "--out", str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "saved at step 20" in proc.stdout and checkpoint.stat().st_size > 100 << 20
    records = recorded(run)
    assert [r["text"] for r in records if r["type"] == "alert"] == []
    [note] = [r["text"] for r in records if r["type"] == "notice" and "waits for" in r["text"]]
    line = line_of(script, "one place on the stack")
    assert note == f"rank 1 waits for rank 0, checkpointing at slow_checkpoint.py:{line} in write", note
    [goodput] = [r["goodput"] for r in records if r["type"] == "exit"]
    assert goodput["stalled_s"] == 0.0 and goodput["paused_s"] > STALL_MIN_S, goodput
