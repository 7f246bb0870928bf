"""monitor.checkpoint / monitor.resume on real tensors and real files, one process."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ddptop.trainer import monitor
from ddptop.trainer.checkpoint import CheckpointError, candidates


def make(width: int = 16) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, width), nn.Dropout(0.3), nn.Linear(width, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, steps: int) -> None:
    """Steps that draw from every generator a checkpoint must restore."""
    for _ in range(steps):
        x = torch.randn(4, 8) * random.random() + float(np.random.rand())
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow  # trains, stops and resumes a model twice: seconds
@pytest.mark.oldest
def test_resume_continues_bitwise_as_if_never_stopped(tmp_path):
    model, optimizer, scheduler = make()
    train(model, optimizer, scheduler, 5)
    path = monitor.checkpoint(model, optimizer, scheduler, step=4, directory=tmp_path, data={"epoch": 1, "offset": 7})
    assert path is not None and path.parent == tmp_path
    train(model, optimizer, scheduler, 5)
    expected = params(model)

    model, optimizer, scheduler = make()
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)  # the resumed process drew differently before resuming
    resumed = monitor.resume(model, optimizer, scheduler, directory=tmp_path)
    assert resumed is not None
    assert (resumed.step, resumed.data, resumed.damaged) == (4, {"epoch": 1, "offset": 7}, [])
    train(model, optimizer, scheduler, 5)
    assert all(torch.equal(a, b) for a, b in zip(params(model), expected, strict=True))
    assert scheduler.get_last_lr() == [0.1 * 0.5**5]


def test_nothing_to_resume_is_none_and_the_directory_is_made(tmp_path):
    model, optimizer, _ = make()
    assert monitor.resume(model, optimizer, directory=tmp_path / "new") is None
    assert (tmp_path / "new").is_dir()


def test_keeps_the_newest_and_sweeps_dead_writers_temp_files(tmp_path):
    model, optimizer, scheduler = make()
    (tmp_path / ".step-00000002.999999.tmp").write_bytes(b"half a checkpoint")
    for step in range(5):
        monitor.checkpoint(model, optimizer, scheduler, step=step, directory=tmp_path, keep=2)
    assert [p.name.split(".")[0] for p in candidates(tmp_path)] == ["step-00000004", "step-00000003"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("step-")) == []


def test_a_damaged_newest_falls_back_to_the_previous_and_says_so(tmp_path, capsys):
    model, optimizer, scheduler = make()
    monitor.checkpoint(model, optimizer, scheduler, step=1, directory=tmp_path)
    newest = monitor.checkpoint(model, optimizer, scheduler, step=2, directory=tmp_path)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a truncated copy
    resumed = monitor.resume(*make(), directory=tmp_path)
    assert resumed is not None and resumed.step == 1
    assert resumed.damaged == [newest.name]
    assert f"damaged checkpoint(s) {newest.name} passed over; resuming from step-00000001" in capsys.readouterr().err


def test_a_flipped_bit_is_caught_by_the_digest(tmp_path):
    model, optimizer, scheduler = make()
    path = monitor.checkpoint(model, optimizer, scheduler, step=3, directory=tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"no intact checkpoint in {tmp_path}: {path.name} failed the digest check"):
        monitor.resume(*make(), directory=tmp_path)


def test_a_checkpoint_of_another_shape_is_refused_in_one_line(tmp_path):
    model, optimizer, scheduler = make(width=16)
    monitor.checkpoint(model, optimizer, scheduler, step=0, directory=tmp_path)
    with pytest.raises(CheckpointError) as err:
        monitor.resume(*make(width=32), directory=tmp_path)
    message = str(err.value)
    assert "does not fit this model: size mismatch for 0.weight" in message
    assert "\n" not in message


def test_an_unwritable_directory_is_refused_at_resume_and_at_checkpoint(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    model, optimizer, _scheduler = make()
    with pytest.raises(CheckpointError, match=f"checkpoint directory {blocker / 'ckpt'} is not writable"):
        monitor.resume(model, optimizer, directory=blocker / "ckpt")
    with pytest.raises(CheckpointError, match=f"cannot write a checkpoint in {blocker / 'ckpt'}"):
        monitor.checkpoint(model, optimizer, step=0, directory=blocker / "ckpt")


KILLED_MID_WRITE = """
import os, signal, sys, torch
from ddptop.trainer import monitor
model = torch.nn.Linear(4, 4)
monitor.checkpoint(model, step=1, directory=sys.argv[1])
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # every byte written, none durable
monitor.checkpoint(model, step=2, directory=sys.argv[1])
"""


@pytest.mark.slow
def test_a_writer_killed_mid_checkpoint_leaves_the_previous_one_to_resume(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    leftovers = sorted(p.name.rsplit(".", 2)[0] for p in tmp_path.iterdir())
    assert leftovers == [".step-00000002", "step-00000001"]  # the temp file names no checkpoint
    resumed = monitor.resume(torch.nn.Linear(4, 4), directory=tmp_path)
    assert resumed is not None and resumed.step == 1


def test_resume_sets_the_reported_step(tmp_path):
    """Under ddptop the dashboard's step follows the script's, not the process's count."""
    from ddptop.trainer.steps import StepTracker

    sent: list[dict] = []
    tracker = StepTracker(0, sent.append)
    model, optimizer, scheduler = make()
    monitor.checkpoint(model, optimizer, scheduler, step=41, directory=tmp_path)
    monitor.bind(tracker)
    try:
        monitor.resume(*make(), directory=tmp_path)
    finally:
        monitor.bind(None)
    assert tracker.step == 42
    assert [(r["type"], r["step"]) for r in sent] == [("resume", 41)]


def test_checkpoints_load_with_weights_only(tmp_path: Path):
    """No pickled code in a checkpoint: torch.load(weights_only=True) reads it."""
    model, optimizer, scheduler = make()
    path = monitor.checkpoint(model, optimizer, scheduler, step=0, directory=tmp_path)
    state = torch.load(path, weights_only=True)
    assert set(state) == {"step", "model", "optimizer", "scheduler", "rng", "data"}
