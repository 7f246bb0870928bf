"""The loss and tokens of real training code, with no line changed: a nanoGPT-style loop with
gradient accumulation and a GradScaler, a plain DDP script, and a PyTorch Lightning job, each under
`ddptop launch --gpus 2` on gloo; ddptop's loss against the one each script computes itself."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
from support import SCRIPTS, recorded, run_ddptop

from ddptop.core import rundir

pytestmark = pytest.mark.slow


def launch(tmp_path: Path, script: str, *args: str) -> tuple[rundir.RunDir, list[dict]]:
    run = rundir.RunDir(tmp_path / "run")
    done = run_ddptop("launch", "--headless", "--run-dir", str(run.path), str(SCRIPTS / script), "--gpus", "2", *args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"\| loss [\d.]+ \|", done.stdout), done.stdout[-1000:]  # the summary line has it
    return run, recorded(run)


def printed(run: rundir.RunDir, rank: int, tag: str) -> list[tuple[int, float]]:
    """(step, value) lines a rank printed, from its own log file (torchrun's tee may join half lines)."""
    lines = rundir.rank_log_tail(run.path, rank, 0, 100_000, streams=("stdout",))
    return [(int(m[1]), float(m[2])) for line in lines if (m := re.match(rf"\[{tag}\] (\d+) (\S+)$", line))]


def losses(records: list[dict]) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for record in records:
        if record["type"] == "step":
            out[record["rank"]][record["step"]] = record["loss"]
    return out


def test_a_nanogpt_style_loop_s_loss_and_tokens(tmp_path):
    """Four micro-steps a step, each loss divided by four and scaled by a GradScaler: ddptop's loss is the step's mean."""
    run, records = launch(tmp_path, "nanogpt_style.py", "--max-iters", "30")
    got = losses(records)
    for rank in (0, 1):
        own = dict(printed(run, rank, "lossum"))
        assert sorted(own) == list(range(30))
        assert got[rank] == pytest.approx(own, rel=1e-12, abs=0.0)
        norms = {r["step"]: r["grad_norm"] for r in records if r["type"] == "step" and r["rank"] == rank}
        assert norms == pytest.approx(dict(printed(run, rank, "gradnorm")), rel=1e-4)  # GRAD NORM: what the script's clip saw
    assert {r["tokens"] for r in records if r["type"] == "step"} == {4 * 4 * 16}  # micro-steps x batch x block


def test_a_plain_script_of_float_inputs_has_a_loss_and_no_tokens(tmp_path):
    _, records = launch(tmp_path, "plain_ddp.py", "--steps", "20")
    steps = [r for r in records if r["type"] == "step"]
    assert len(steps) == 40 and all(r["loss"] > 0 for r in steps)
    assert all("tokens" not in r for r in steps)
    export = run_ddptop("export", str(tmp_path / "run"))
    assert export.stdout.count('"loss":') >= 40


@pytest.mark.frameworks
def test_a_lightning_job_s_loss_is_the_mean_of_its_accumulated_micro_batches(tmp_path):
    """Validation every 5 steps: Lightning leaves the DDP wrapper in eval mode after it, and the
    steps after it have their losses as those before."""
    pytest.importorskip("lightning")
    run, records = launch(tmp_path, "lightning_job.py", "--max-steps", "12", "--accumulate", "2", "--val-every", "10")
    got = losses(records)
    for rank in (0, 1):
        micro: dict[int, list[float]] = defaultdict(list)
        for step, value in printed(run, rank, "micro"):
            micro[step].append(value)
        assert sorted(micro) == list(range(12)) and all(len(values) == 2 for values in micro.values())
        assert got[rank] == pytest.approx({step: sum(values) / 2 for step, values in micro.items()}, rel=1e-6)
    assert {r["tokens"] for r in records if r["type"] == "step"} == {2 * 8 * 17}  # the batch of token ids as Lightning passes it
