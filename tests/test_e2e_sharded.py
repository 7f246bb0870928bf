"""Sharded training seen as DDP is: the grad norm of FSDP2, HSDP and FSDP2 beside tensor
parallelism, added up from the ranks' shares with no collective of ddptop's, on real jobs
under `ddptop launch` on gloo (tests/scripts/fsdp2_job.py, which never names ddptop).

The script clips nothing (--no-clip) and prints the norm of its gradients gathered whole
(`full_tensor`), which is what clip_grad_norm_ returns: the job's grad norm, as the model
adds it up from the event log, is that norm at every step.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import pytest
from support import SCRIPTS, fully_shard_ignores, norms_added_up, recorded, run_ddptop
from test_e2e_real_trainers import by_attempt, printed

from ddptop.core import rundir
from ddptop.core.model.job import JobState
from ddptop.supervisor.watching.rules.nan import APPLIED_SHARDED, OWN_LOSS, SKIPPED_ALL

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _fully_shard() -> None:
    if not hasattr(__import__("torch.distributed.fsdp").distributed.fsdp, "fully_shard"):
        pytest.skip("FSDP2's public fully_shard is torch 2.6's")


def run_sharded(
    tmp_path: Path, ranks: int, *args: str, options: tuple[str, ...] = (), clips: bool = False
) -> tuple[rundir.RunDir, list[dict]]:
    """fsdp2_job.py on this many ranks with its args, clipping nothing unless it clips;
    options: ddptop's own."""
    run = rundir.RunDir(tmp_path / "run")
    script = str(SCRIPTS / "fsdp2_job.py")
    launch = ("launch", "--headless", "--run-dir", str(run.path), *options, script, "--gpus", str(ranks))
    done = run_ddptop(*launch, *(() if clips else ("--no-clip",)), *args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return run, recorded(run)


def timed_dims(records: list[dict], ranks: int) -> dict[int, set[str]]:
    """rank -> the mesh dimensions its timed step 1 had collectives in (the first sharded
    step arms the timing of the next: trainer/collective_timer.py)."""
    timed = {r["rank"]: r for r in records if r["type"] == "step" and r["step"] == 1}
    assert sorted(timed) == list(range(ranks)) and all(r.get("comm_step") == 1 for r in timed.values()), timed
    return {rank: set(r["comm_dims"]) for rank, r in timed.items()}


def shows_the_full_norm(run: rundir.RunDir, records: list[dict], ranks: int, steps: int) -> None:
    """Every step's job norm is the script's own of its whole gradients; each rank told its
    shards' norm and share, and no grad norm of its own; no alert."""
    own = printed(run, 0, 0, "norm")
    assert sorted(own) == list(range(steps))
    assert norms_added_up(records) == pytest.approx(own, rel=1e-5)
    by_rank = by_attempt(records)
    for rank in range(ranks):
        shown = by_rank[rank, 0]
        assert sorted(shown) == list(range(steps))
        assert all("shard_norm" in r and "grad_sq_share" in r and "grad_norm" not in r for r in shown.values()), rank
    assert [r["kind"] for r in records if r["type"] == "alert"] == []


@pytest.mark.parametrize("precision", [(), ("--bf16",)], ids=["fp32", "bf16 compute, fp32 reduce"])
def test_fsdp2_on_two_ranks_shows_the_norm_of_the_whole_gradients(ddptop_home, tmp_path, precision):
    """Each rank holds half of every gradient: the shares are summed. Under torchtitan's mixed
    precision too (FSDP2's MixedPrecisionPolicy: bfloat16 compute, gradients reduced in float32)."""
    run, records = run_sharded(tmp_path, 2, "--steps", "12", *precision)
    shows_the_full_norm(run, records, 2, 12)
    assert timed_dims(records, 2) == {0: {"world"}, 1: {"world"}}
    # The shards differ: neither rank's own is the norm.
    last = {r["rank"]: r["shard_norm"] for r in records if r["type"] == "step" and r["step"] == 11}
    assert all(shard < printed(run, 0, 0, "norm")[11] for shard in last.values()), last


def test_fsdp2_with_a_parameter_of_each_rank_s_own_counts_every_rank_s_and_compares_none(ddptop_home, tmp_path):
    """A parameter fully_shard ignores, different on each rank (an expert of its own): each
    rank's counts whole in the norm, and no rank's is compared with another's for a desync."""
    if not fully_shard_ignores():
        pytest.skip("fully_shard takes ignored_params since torch 2.7")
    run, records = run_sharded(tmp_path, 2, "--own-scale", "--steps", "12", options=("--desync-every", "5"))
    shows_the_full_norm(run, records, 2, 12)
    assert not [r for r in records if r["type"] == "step" and "checksum" in r]


def test_hsdp_2x2_counts_each_replica_s_shards_once_and_compares_them_across_replicas(ddptop_home, tmp_path):
    """Two replicas, each sharded over two ranks: every shard is held twice, and counted once.
    Every 5 steps each rank's checksum is of its shards, compared with the rank that holds the
    same ones in the other replica: no alert while they agree."""
    run, records = run_sharded(tmp_path, 4, "--hsdp", "2", "--steps", "12", options=("--desync-every", "5"))
    shows_the_full_norm(run, records, 4, 12)
    # Each rank's comm, per mesh dimension: FSDP's collectives within its replica, the all-reduce across.
    assert timed_dims(records, 4) == {rank: {"shard", "replicate"} for rank in range(4)}
    one = next(r["comm_dims"] for r in records if r["type"] == "step" and r["step"] == 1)
    assert set(one["shard"]) == {"all-gather", "reduce-scatter"} and set(one["replicate"]) == {"all-reduce"}, one
    told = {(r["rank"], r["step"]): r["replicas"] for r in records if r["type"] == "step" and "checksum" in r}
    assert told == {(rank, step): [rank % 2, rank % 2 + 2] for rank in range(4) for step in (0, 5, 10)}, told


def test_an_hsdp_rank_whose_shard_drifts_from_its_replica_s_is_named(ddptop_home, tmp_path):
    """Rank 3's shard of a weight moves at step 6, as a flipped bit would: the next check, at
    step 10, finds ranks 1 and 3 (the two holders of that shard) apart, and no other pair."""
    nudged = ("--nudge-at", "6", "--nudge-rank", "3")
    _, records = run_sharded(tmp_path, 4, "--hsdp", "2", "--steps", "12", *nudged, options=("--desync-every", "5"))
    [alert] = [r for r in records if r["type"] == "alert"]
    assert alert["kind"] == "desync" and alert["ranks"] == [1, 3] and alert["step"] == 10, alert
    assert "between the data-parallel ranks 1,3" in alert["text"], alert["text"]


def test_fsdp2_beside_tensor_parallelism_counts_replicated_parameters_once(ddptop_home, tmp_path):
    """torchtitan's 2-D layout on four ranks: a tensor-parallel pair shares a batch, and the
    biases RowwiseParallel replicates over the pair are held by both: counted once."""
    run, records = run_sharded(tmp_path, 4, "--tp", "2", "--steps", "12")
    shows_the_full_norm(run, records, 4, 12)
    # FSDP's collectives go over the mesh's "dp" dimension; tensor parallelism's over "tp": DTensor's
    # functional all-reduces of RowwiseParallel's partial sums (trainer/functional_timing.py), and
    # the all-gathers of the script's whole gradients.
    assert timed_dims(records, 4) == {rank: {"dp", "tp"} for rank in range(4)}
    one = next(r["comm_dims"] for r in records if r["type"] == "step" and r["step"] == 1)
    assert set(one["dp"]) == {"all-gather", "reduce-scatter"} and "all-reduce" in one["tp"], one


def test_tensor_parallelism_alone_counts_its_shared_batch_once_and_names_a_rank_slow_in_its_compute(ddptop_home, tmp_path):
    """torchtitan with no data-parallel degree: every layer split over both ranks by tensor
    parallelism, no fully_shard, both ranks given the same batch of 16. Rank 1 spends 80 ms more
    in each step's compute; rank 0 waits for it in the collectives. The job's samples/s counts
    the batch once, its norm is the whole gradients', and rank 1 is named for its compute."""
    from ddptop.core.model.metrics import SAMPLES_PER_S

    slow = ("--slow-compute-rank", "1", "--slow-compute-ms", "80")
    run, records = run_sharded(tmp_path, 2, "--tp-only", "--steps", "150", *slow)
    assert norms_added_up(records) == pytest.approx(printed(run, 0, 0, "norm"), rel=1e-5)
    state = JobState()
    for record in records:
        state.ingest(record)
    assert [state.ranks[rank].batch_shared for rank in (0, 1)] == [2, 2]
    rates = [SAMPLES_PER_S.read(state.ranks[rank]) for rank in (0, 1)]
    assert state.totals().of(SAMPLES_PER_S) == pytest.approx(sum(rates) / 2)
    stragglers = [r for r in records if r["type"] == "alert" and r["kind"] == "straggler"]
    assert [a["ranks"] for a in stragglers] == [[1]], [a["text"] for a in stragglers]
    assert stragglers[0]["cause"] == "compute", stragglers[0]["text"]


def test_an_fsdp2_rank_slow_in_its_data_is_named_with_its_input_as_the_cause(ddptop_home, tmp_path):
    """Rank 1 waits 80 ms for each batch; rank 0 waits for it in the first all-gather of every
    forward. Their steps take as long as each other's, so the straggler is told by its own work:
    its data wait, timed at its first forward as at DDP's. (80 ms: on two shared cores a timed
    step's compute moves by tens of ms from one to the next.)"""
    _, records = run_sharded(tmp_path, 2, "--steps", "150", "--slow-data-rank", "1", "--slow-data-ms", "80")
    stragglers = [r for r in records if r["type"] == "alert" and r["kind"] == "straggler"]
    assert [a["ranks"] for a in stragglers] == [[1]], [a["text"] for a in stragglers]
    assert stragglers[0]["cause"] == "input", stragglers[0]["text"]
    assert "; the other ranks wait for it in the all-gathers" in stragglers[0]["text"], stragglers[0]["text"]


def test_an_fsdp2_rank_slow_in_its_compute_is_named_with_its_compute_as_the_cause(ddptop_home, tmp_path):
    """Rank 1 spends 80 ms more between forward and backward; rank 0 waits for it in the
    backward's collectives. FSDP2 has no reducer to time the compute as DDP's does: the timed
    steps' own work is the step less the data wait and the wait in the collectives, so the
    waiting rank's is small and the slow rank's is its 80 ms more."""
    _, records = run_sharded(tmp_path, 2, "--steps", "150", "--slow-compute-rank", "1", "--slow-compute-ms", "80")
    stragglers = [r for r in records if r["type"] == "alert" and r["kind"] == "straggler"]
    assert [a["ranks"] for a in stragglers] == [[1]], [a["text"] for a in stragglers]
    assert stragglers[0]["cause"] == "compute", stragglers[0]["text"]
    assert "slow in its compute" in stragglers[0]["text"], stragglers[0]["text"]
    # Where rank 0 waits: the collective its timed steps took longest in, of the one mesh dimension.
    assert re.search(r"; the other ranks wait for it in the (all-gathers|reduce-scatters);", stragglers[0]["text"]), stragglers[0]["text"]
    waited = {rank: [r["comm_ms"] for r in records if r["type"] == "step" and r["rank"] == rank and "comm_dims" in r] for rank in (0, 1)}
    # Rank 0 waits about the 80 ms rank 1 spends more; both wait besides for the collectives themselves, on two shared cores.
    assert statistics.median(waited[0]) - statistics.median(waited[1]) > 40, waited


def test_a_non_finite_fsdp2_step_the_script_clips_is_skipped_on_both_ranks_and_training_goes_on(ddptop_home, tmp_path):
    """The script's clip_grad_norm_ takes the global norm over both ranks: each reads the same
    verdict and skips the step alike, so the NaN rank 1's loss made at step 5 reaches no weight."""
    run, records = run_sharded(tmp_path, 2, "--steps", "12", "--nan-at", "5", "--nan-rank", "1", clips=True)
    [alert] = [r for r in records if r["type"] == "alert"]
    assert alert["kind"] == "nan" and alert["step"] == 5 and alert["ranks"] == [1], alert
    assert OWN_LOSS.format(ranks="rank 1") in alert["text"] and SKIPPED_ALL in alert["text"], alert["text"]
    assert APPLIED_SHARDED not in alert["text"]
    for rank in (0, 1):
        after = {s: v for s, v in printed(run, rank, 0, "loss").items() if s > 5}
        assert sorted(after) == list(range(6, 12)) and all(math.isfinite(v) for v in after.values()), after
