"""Right numbers on training code as people write it, run unchanged under `ddptop launch --gpus 2`:
minGPT-ddp's Trainer (mixed precision, a GradScaler it never unscales before clipping, a
snapshot.pt it resumes from by itself), a Hugging Face Trainer job, an Accelerate loop that
accumulates, and a model sharded with FSDP2's fully_shard or FSDP1's FullyShardedDataParallel. What ddptop shows is checked against what each script computes or logs itself."""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from support import SCRIPTS, counted_once_a_group, fully_shard_ignores, norms_added_up, recorded, run_ddptop

from ddptop.core import rundir
from ddptop.supervisor.watching.rules.nan import APPLIED_SHARDED, OWN_LOSS, SKIPPED_ALL
from ddptop.trainer.optimizer_step import RESUMED_FROM

pytestmark = pytest.mark.slow


def launch(tmp_path: Path, script: Path, *args: str) -> tuple[rundir.RunDir, list[dict], str]:
    run = rundir.RunDir(tmp_path / "run")
    done = run_ddptop("launch", "--headless", "--run-dir", str(run.path), str(script), "--gpus", "2", *args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return run, recorded(run), done.stdout


def by_attempt(records: list[dict]) -> dict[tuple[int, int], dict[int, dict]]:
    """(rank, attempt) -> step -> its step record: a rank's records follow its attempt's hello."""
    attempt: dict[int, int] = {}
    out: dict[tuple[int, int], dict[int, dict]] = defaultdict(dict)
    for record in records:
        if record["type"] == "rank_hello":
            attempt[record["rank"]] = record["restart"]
        elif record["type"] == "step":
            out[record["rank"], attempt[record["rank"]]][record["step"]] = record
    return out


def printed(run: rundir.RunDir, rank: int, attempt: int, tag: str) -> dict[int, float]:
    lines = rundir.rank_log_tail(run.path, rank, attempt, 100_000, streams=("stdout",))
    return {int(m[1]): float(m[2]) for line in lines if (m := re.match(rf"\[{tag}\] (\d+) (\S+)$", line))}


def shows_the_scripts_own(run: rundir.RunDir, by_rank: dict[tuple[int, int], dict[int, dict]], steps: int, samples: int) -> None:
    """Both ranks' first attempt has each of its steps, each with the loss and norm its script
    printed, and the batch the root's forward was given."""
    for rank in (0, 1):
        shown = by_rank[rank, 0]
        assert sorted(shown) == list(range(steps))
        for field, tag in (("loss", "loss"), ("grad_norm", "norm")):
            assert {s: r[field] for s, r in shown.items()} == pytest.approx(printed(run, rank, 0, tag), rel=1e-5), field
        assert {r["samples"] for r in shown.values()} == {samples}


def test_a_mingpt_style_amp_job_that_resumes_itself_shows_its_own_norms_and_steps(ddptop_home, tmp_path):
    """AMP that clips the scaled gradients: GRAD NORM is the unscaled pre-clip norm on every step.
    Killed at step 25, the script resumes from its step-20 snapshot, and so do ddptop's steps."""
    snapshot = tmp_path / "snapshot.pt"
    args = ("--max-steps", "40", "--save-every", "10", "--die-at", "25", "--snapshot", str(snapshot))
    run, records, _ = launch(tmp_path, SCRIPTS / "mingpt_style.py", *args)
    steps = by_attempt(records)
    for rank in (0, 1):
        resumed = steps[rank, 1]
        assert sorted(resumed) == list(range(20, 40)), "the second attempt's steps go on from the snapshot's"
        own = printed(run, rank, 1, "prenorm")
        assert {s: r["grad_norm"] for s, r in resumed.items()} == pytest.approx(own, rel=1e-4)
        # A rank killed outright (rank 1 by itself, rank 0 by torchrun's SIGTERM if that comes
        # before gloo's error) loses what its sender had not sent yet: up to a flush interval,
        # about as long as this attempt. What it did send must be right.
        first = steps[rank, 0]
        assert {s: r["grad_norm"] for s, r in first.items()} == pytest.approx(
            {s: v for s, v in printed(run, rank, 0, "prenorm").items() if s in first}, rel=1e-4
        )
    assert max(len(steps[0, 0]), len(steps[1, 0])) >= 5, "the first attempt's records were compared"
    said = [r for r in records if r["type"] == "resume"]
    assert {(r["rank"], r["step"], r["path"]) for r in said} == {(0, 19, RESUMED_FROM), (1, 19, RESUMED_FROM)}
    (row,) = json.loads(run_ddptop("ls", "--json").stdout)
    assert row["steps"] == 40 and row["goodput"]["failures"] == 1


HF_JOB = """
import argparse
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=256, length=16):
        self.ids = torch.randint(0, 100, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=1, n_head=2))
training = TrainingArguments(
    output_dir=args.out, max_steps=20, per_device_train_batch_size=4, use_cpu=True, report_to=[],
    logging_steps=5, save_strategy="no", max_grad_norm=1.0, learning_rate=1e-3,
)
Trainer(model=model, args=training, train_dataset=Tokens()).train()
"""


@pytest.mark.frameworks
def test_a_hugging_face_trainer_job_has_tokens_and_the_grad_norm_the_trainer_logs(ddptop_home, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    script = tmp_path / "hf_trainer.py"
    script.write_text(HF_JOB)
    run, records, stdout = launch(tmp_path, script, "--out", str(tmp_path / "out"))
    steps = [r for r in records if r["type"] == "step"]
    assert len(steps) == 40 and all(r["tokens"] == 4 * 16 and r["samples"] == 4 for r in steps)
    assert re.search(r"\| [\d,]+ tokens/s \|", stdout), stdout[-1000:]
    logged = [
        ast.literal_eval(line[line.index("{") :])
        for line in rundir.rank_log_tail(run.path, 0, 0, 100_000, streams=("stdout", "stderr"))
        if "'grad_norm'" in line
    ]
    assert len(logged) == 4  # every logging_steps=5 of 20
    rank0 = {r["step"]: r["grad_norm"] for r in steps if r["rank"] == 0}
    # The Trainer logs the norm of the step just taken: steps 5, 10, 15, 20 are ddptop's 4, 9, 14, 19.
    # The Trainer logs its norm rounded to 4 significant digits (1.005 for 1.00547): half a unit in the last is 5e-4 of it.
    assert [rank0[5 * (i + 1) - 1] for i in range(4)] == pytest.approx([float(entry["grad_norm"]) for entry in logged], rel=6e-4)


@pytest.mark.frameworks
def test_an_accelerate_loop_that_accumulates_shows_one_step_per_sync_with_its_own_loss_norm_and_lr(ddptop_home, tmp_path):
    """Accelerate's accumulate() runs optimizer.step() on every micro-batch, and its wrapper steps
    the optimizer only on the one that syncs: a step is that sync, 2 micro-batches of 16, its loss
    the sum of the divided losses backward() was given, its norm the one accelerator.clip_grad_norm_
    returned, its lr the one it stepped with. Counting each micro-batch, or losses outside the
    step, or the norm of the gradients after the clip, fails it."""
    pytest.importorskip("accelerate")
    run, records, _ = launch(tmp_path, SCRIPTS / "accelerate_loop.py")
    steps = by_attempt(records)
    for rank in (0, 1):
        assert sorted(steps[rank, 0]) == list(range(16)), "1024 samples, 2 ranks, 2 micro-batches of 16 a step"
        for field, tag in (("loss", "loss"), ("grad_norm", "norm"), ("lr", "lr")):
            shown = {s: r[field] for s, r in steps[rank, 0].items()}
            assert shown == pytest.approx(printed(run, rank, 0, tag), rel=1e-5), field
        assert {r["samples"] for r in steps[rank, 0].values()} == {32}
    assert [r["kind"] for r in records if r["type"] == "alert"] == []


def test_a_job_that_shards_its_model_with_fsdp2_runs_as_under_torchrun_and_shows_its_own_loss_and_norm(ddptop_home, tmp_path):
    """ddptop is for DDP, but a script that shards its model with fully_shard must run unharmed:
    its gradients are DTensors, each rank's parameters a different shard. Every step shows the
    script's loss, the norm its clip_grad_norm_ returned and its batch, and a checksum every 5 steps
    compares no shards (which differ by design): no desync alert."""
    if not hasattr(__import__("torch.distributed.fsdp").distributed.fsdp, "fully_shard"):
        pytest.skip("FSDP2's public fully_shard is torch 2.6's")
    run, records, _ = launch(tmp_path, SCRIPTS / "fsdp2_job.py", "--desync-every", "5", "--", "--steps", "30")
    shows_the_scripts_own(run, by_attempt(records), steps=30, samples=16)
    assert [r["kind"] for r in records if r["type"] == "alert"] == []
    assert any(r["type"] == "rank_note" and "sharded" in r["text"] for r in records)


def test_a_lightning_job_that_shards_with_fsdp2_shows_its_loss_the_whole_norm_and_its_collectives(ddptop_home, tmp_path):
    """Lightning's ModelParallelStrategy, fully_shard in configure_model: each rank's loss is its
    script's, the job's norm the norm of the whole gradients, added up from the ranks' shares, and
    step 1's all-gathers and reduce-scatters are timed."""
    pytest.importorskip("lightning")
    if not hasattr(__import__("torch.distributed.fsdp").distributed.fsdp, "fully_shard"):
        pytest.skip("FSDP2's public fully_shard is torch 2.6's")
    run, records, _ = launch(tmp_path, SCRIPTS / "lightning_job.py", "--", "--fsdp2", "--accumulate", "1", "--max-steps", "12")
    by_rank = by_attempt(records)
    for rank in (0, 1):
        assert {s: r["loss"] for s, r in by_rank[rank, 0].items()} == pytest.approx(printed(run, rank, 0, "micro"), rel=1e-5)
        assert {r["samples"] for r in by_rank[rank, 0].values()} == {8}
    assert by_rank[0, 0][0]["loss"] != by_rank[1, 0][0]["loss"], "each rank its own batch"
    assert norms_added_up(records) == pytest.approx(printed(run, 0, 0, "norm"), rel=1e-5)
    timed = [r["comm_dims"] for r in records if r["type"] == "step" and r["step"] == 1]
    assert len(timed) == 2 and all(set(dims["world"]) == {"all-gather", "reduce-scatter"} for dims in timed), timed
    assert [r["kind"] for r in records if r["type"] == "alert"] == []


def test_fsdp2_beside_tensor_parallelism_counts_each_sample_once(ddptop_home, tmp_path):
    """torchtitan's layout on four ranks: each layer split over two ranks by tensor parallelism,
    fully_shard over the other dimension of the mesh. A tensor-parallel pair is given one batch,
    so the job trains two batches a step, not four: its samples/s counts each rank's at half.
    Each rank shows its script's loss and norm, and the ranks tell whom they are data-parallel with."""
    if not hasattr(__import__("torch.distributed.fsdp").distributed.fsdp, "fully_shard"):
        pytest.skip("FSDP2's public fully_shard is torch 2.6's")
    run = rundir.RunDir(tmp_path / "run")
    script = str(SCRIPTS / "fsdp2_job.py")
    done = run_ddptop("launch", "--headless", "--run-dir", str(run.path), script, "--gpus", "4", "--tp", "2", "--steps", "30", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = recorded(run)
    shows_the_scripts_own(run, by_attempt(records), steps=30, samples=16)
    assert [r["kind"] for r in records if r["type"] == "alert"] == []
    told = {r["rank"]: r["replicas"] for r in records if r["type"] == "heartbeat" and "replicas" in r}
    assert told == {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    counted_once_a_group(records, ranks=4, groups=2)


def test_clip_grad_on_gradients_of_two_meshes_takes_the_global_norm_and_leaves_the_job_running(ddptop_home, tmp_path):
    """Tensor parallelism splits two layers over a 2-D mesh and FSDP shards the head alone over its
    1-D one: norms of the two meshes cannot be stacked (torch's own clip_grad_norm_ raises), and
    --clip-grad's norm did so inside the optimizer step, ending a job that runs under torchrun.
    Reduced mesh by mesh, it is the global norm the script measures itself, on every step."""
    if not hasattr(__import__("torch.distributed.fsdp").distributed.fsdp, "fully_shard"):
        pytest.skip("FSDP2's public fully_shard is torch 2.6's")
    run = rundir.RunDir(tmp_path / "run")
    script = str(SCRIPTS / "fsdp2_job.py")
    args = ("--gpus", "4", "--tp", "2", "--tp-last-plain", "--no-clip", "--steps", "10")
    done = run_ddptop("launch", "--headless", "--clip-grad", "1000", "--run-dir", str(run.path), script, *args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shows_the_scripts_own(run, by_attempt(recorded(run)), steps=10, samples=16)


def test_a_pipeline_schedule_shows_the_mean_loss_of_its_micro_batches_and_each_batch_once(ddptop_home, tmp_path):
    """torchtitan's pipeline: GPipe over two stages, four micro-batches a step, FSDP2 over each
    stage's two data-parallel ranks. The schedule calls backward() on each micro-batch's loss
    and divides the gradients by four: the step's loss is their mean, as the script logs it,
    not their sum. Its first step runs each stage once more to learn shapes, which is no
    batch: every step is the 16 samples the script split, and the job counts each once. It
    clips as torchtitan does, the stages' norms added between get_total_norm and
    clip_grads_with_norm_: every rank shows that global norm."""
    fsdp = __import__("torch.distributed.fsdp").distributed.fsdp
    if not hasattr(fsdp, "fully_shard"):
        pytest.skip("FSDP2's public fully_shard is torch 2.6's")
    run = rundir.RunDir(tmp_path / "run")
    script = str(SCRIPTS / "pipelining_job.py")
    done = run_ddptop("launch", "--headless", "--run-dir", str(run.path), script, "--gpus", "4", "--steps", "20", "--clip", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = recorded(run)
    steps = by_attempt(records)
    for rank in range(4):
        assert sorted(steps[rank, 0]) == list(range(20)) and {r["samples"] for r in steps[rank, 0].values()} == {16}
        # Clipped as torchtitan clips, in two calls: the stages' global norm it clipped by.
        shown = {s: r["grad_norm"] for s, r in steps[rank, 0].items()}
        assert shown == pytest.approx(printed(run, rank, 0, "norm"), rel=1e-5)
    for rank in (1, 3):  # the last stage's
        shown = {s: r["loss"] for s, r in steps[rank, 0].items()}
        assert shown == pytest.approx(printed(run, rank, 0, "loss"), rel=1e-5)
    assert [r["kind"] for r in records if r["type"] == "alert"] == []
    counted_once_a_group(records, ranks=4, groups=2)


def test_a_job_that_shards_its_model_with_fsdp1_shows_its_own_loss_norm_and_batch_and_no_desync(ddptop_home, tmp_path):
    """FSDP1 keeps each rank's shards in flat parameters, plain tensors: compared for a desync,
    the ranks' differ from the first step on, and each rank's norm of its own shards differs
    from the other's. Every step shows the script's loss, the global norm its model's
    clip_grad_norm_ returned and the batch the root's forward was given (its units' forwards
    inside it add none), and no checksum every 5 steps compares shards: no alert."""
    run, records, _ = launch(tmp_path, SCRIPTS / "fsdp1_job.py", "--desync-every", "5", "--", "--steps", "30")
    steps = by_attempt(records)
    shows_the_scripts_own(run, steps, steps=30, samples=16)
    assert not any("checksum" in r for rank in (0, 1) for r in steps[rank, 0].values())
    assert [r["kind"] for r in records if r["type"] == "alert"] == []
    assert any(r["type"] == "rank_note" and "FullyShardedDataParallel" in r["text"] for r in records)
    # Step 1's collectives are timed (trainer/collective_timer.py): FSDP1's over the whole job.
    for rank in (0, 1):
        assert set(steps[rank, 0][1]["comm_dims"]) == {"world"}, steps[rank, 0][1]
        assert {"all-gather", "reduce-scatter"} <= set(steps[rank, 0][1]["comm_dims"]["world"]), steps[rank, 0][1]


def test_a_non_finite_step_of_a_sharded_job_names_the_rank_whose_own_loss_was_non_finite(ddptop_home, tmp_path):
    """Rank 1's loss is infinite: the reduce-scatter makes every rank's shards non-finite, and
    each rank's own loss says where it came from, as in a DDP job of two ranks (not 'ranks 0,1',
    as a rank alone in its job would say). The root's clip_grad_norm_ took the global norm, which
    both ranks read alike: both skip the step. Without the script's clip it is applied."""
    _, records, _ = launch(tmp_path, SCRIPTS / "fsdp1_job.py", "--", "--steps", "8", "--inf-at", "5")
    (alert,) = [r for r in records if r["type"] == "alert"]
    assert alert["kind"] == "nan" and alert["step"] == 5 and alert["ranks"] == [1], alert["text"]
    assert OWN_LOSS.format(ranks="rank 1") in alert["text"] and SKIPPED_ALL in alert["text"]
    _, records, _ = launch(tmp_path / "no clip", SCRIPTS / "fsdp1_job.py", "--", "--steps", "8", "--inf-at", "5", "--no-clip")
    (alert,) = [r for r in records if r["type"] == "alert"]
    assert alert["kind"] == "nan" and alert["step"] == 5 and APPLIED_SHARDED in alert["text"], alert["text"]


def test_clip_grad_on_a_job_fsdp1_shards_with_its_original_parameters_takes_the_global_norm(ddptop_home, tmp_path):
    """With use_orig_params each parameter the optimizer steps is a view of its rank's shard (or
    empty): --clip-grad's norm is their global one, all-reduced by the root's own clip, equal to the
    script's on both ranks at every step."""
    run, records, _ = launch(tmp_path, SCRIPTS / "fsdp1_job.py", "--clip-grad", "1000", "--", "--steps", "20", "--no-clip", "--orig")
    steps = by_attempt(records)
    for rank in (0, 1):
        assert {s: r["grad_norm"] for s, r in steps[rank, 0].items()} == pytest.approx(printed(run, rank, 0, "norm"), rel=1e-5)
        assert not any(r["clipped"] for r in steps[rank, 0].values())
    assert [r["kind"] for r in records if r["type"] == "alert"] == []


@pytest.mark.parametrize("own", [(), ("--own-scale",)], ids=["sharded", "and a parameter of each rank's own"])
def test_clip_grad_on_a_job_fsdp2_shards_takes_the_global_norm_over_both_ranks(ddptop_home, tmp_path, own):
    """--clip-grad on sharded gradients needs their global norm, which neither rank's shards
    give alone: ddptop's (above the clip, so the run goes as the script's) equals the norm the
    script measures of each gradient gathered whole, on both ranks, at every step. So too where
    each rank has a parameter of its own that fully_shard ignores: every rank's counts."""
    fsdp = __import__("torch.distributed.fsdp").distributed.fsdp
    if not hasattr(fsdp, "fully_shard"):
        pytest.skip("FSDP2's public fully_shard is torch 2.6's")
    if own and not fully_shard_ignores():
        pytest.skip("fully_shard takes ignored_params since torch 2.7")
    run, records, _ = launch(tmp_path, SCRIPTS / "fsdp2_job.py", "--clip-grad", "1000", "--", "--steps", "20", "--no-clip", *own)
    steps = by_attempt(records)
    for rank in (0, 1):
        assert {s: r["grad_norm"] for s, r in steps[rank, 0].items()} == pytest.approx(printed(run, rank, 0, "norm"), rel=1e-5)
        assert not any(r["clipped"] for r in steps[rank, 0].values())
