"""Profiler captures: a rank's own capture on real DDP (gloo, world of one), the supervisor's
bookkeeping of captures, and what a user reads of them."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from support import accumulating_step, wait_for
from torch import nn

from ddptop.core.model import profiles
from ddptop.core.model.job import JobState
from ddptop.core.policy import GuardPolicy
from ddptop.supervisor.captures import Captures
from ddptop.trainer import hooks, patches
from ddptop.trainer.profiling import Captures as RankCaptures
from ddptop.trainer.steps import StepTracker


@pytest.fixture(autouse=True)
def torch_put_back() -> Iterator[None]:
    """Each test's hooks come off after it, whatever happened (patches.py)."""
    yield
    patches.undo()


def test_a_rank_captures_the_steps_asked_for_from_its_next_boundary_and_writes_a_trace(gloo_world_of_one, tmp_path):
    sent: list[dict[str, Any]] = []
    captures = RankCaptures(0, 0, sent.append)
    probe = hooks.install(StepTracker(0, emit=lambda record: None), GuardPolicy(), captures=captures)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64)

    def step() -> None:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    for _ in range(3):
        step()
    assert not captures.active and "torch.profiler" not in repr(probe.captures.__dict__)
    captures.ask({"id": "t1", "steps": 4, "folder": str(tmp_path / "profiles")})
    captures.ask({"id": "t2", "steps": 4, "folder": str(tmp_path / "profiles")})  # refused: one at a time
    assert captures.active and sent[0]["id"] == "t2" and "one capture at a time" in sent[0]["error"]
    for _ in range(7):
        step()
    [record] = wait_for(lambda: [r for r in sent if r["id"] == "t1"], 30, "the capture's record")
    assert not captures.active
    # Asked between steps 2 and 3: from the next boundary on, the end of step 3.
    assert (record["rank"], record["first_step"], record["steps"]) == (0, 4, 4) and "error" not in record, record
    phases = record["phases"]
    assert set(phases) == {"data", "forward", "backward", "comm", "overlap", "optimizer", "step"}, phases
    assert 0 < phases["forward"] < phases["step"] and phases["comm"] > 0
    assert any(name == "aten::addmm" and cpu > 0 for name, cpu, _, _ in record["ops"]), record["ops"]
    assert record["path"].endswith("attempt0-rank0-step4.pt.trace.json.gz")
    with gzip.open(record["path"]) as trace:
        names = {event.get("name") for event in json.load(trace)["traceEvents"]}
    assert "aten::addmm" in names and any(name.startswith("Optimizer.step#AdamW") for name in names), sorted(names)[:40]
    assert any(str(name).startswith("ProfilerStep#") for name in names), sorted(map(str, names))
    assert model.logger is not None  # DDP's sample rate is its own again: every 100th iteration
    before = len(sent)
    for _ in range(3):
        step()
    assert len(sent) == before and not captures.active


def test_micro_batches_before_the_synced_one_are_their_own_phase_not_data_wait(gloo_world_of_one, tmp_path):
    """DDP times the forward that synchronises: under gradient accumulation (no_sync) the
    micro-batches before it were counted as data wait, which sends a user to their DataLoader."""
    sent: list[dict[str, Any]] = []
    captures = RankCaptures(0, 0, sent.append)
    hooks.install(StepTracker(0, emit=lambda record: None), GuardPolicy(), captures=captures)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 256)
    accumulating_step(model, optimizer, x, micro_batches=6)
    captures.ask({"id": "a", "steps": 3, "folder": str(tmp_path)})
    for _ in range(5):
        accumulating_step(model, optimizer, x, micro_batches=6)
    [record] = wait_for(lambda: [r for r in sent if r["id"] == "a"], 30, "the capture's record")
    phases = record["phases"]
    assert "error" not in record and set(phases) >= {"data", "accumulation", "forward", "backward"}, record
    # Five micro-batches are about five times the synced one's compute, a margin that a loaded
    # machine's preemptions do not close (with two, a CI run beside a 4-rank job once did);
    # nothing waits for data here.
    assert phases["accumulation"] > phases["forward"] + phases["backward"] > 0, phases
    assert phases["data"] < phases["accumulation"] / 10, phases
    [head, *_] = profiles.rank_lines(record)
    assert "micro-batches before the synced one" in head, head


def test_a_rank_that_exits_mid_capture_says_so(gloo_world_of_one, tmp_path):
    sent: list[dict[str, Any]] = []
    captures = RankCaptures(2, 1, sent.append)
    captures.ask({"id": "x", "steps": 10, "folder": str(tmp_path)})
    captures.boundary(5)
    captures.boundary(6)
    captures.abort("the rank exited")
    [record] = sent
    assert record["error"] == "the rank exited 1 of 10 steps into the capture" and record["first_step"] == 5
    assert not captures.active


def job_of(ranks: int) -> JobState:
    state = JobState()
    for rank in range(ranks):
        state.ingest(
            {
                "type": "rank_hello",
                "rank": rank,
                "local_rank": rank,
                "world_size": ranks,
                "node": 0,
                "host": "h",
                "pid": 100 + rank,
                "restart": 0,
            }
        )
    return state


class Supervisor:
    """What the supervisor's Captures talks to: records kept, frames to ranks kept."""

    def __init__(self, tmp_path, connected: set[int] | None = None) -> None:
        self.records: list[dict] = []
        self.told: list[tuple[int, dict]] = []
        self.now = 0.0
        self.connected = connected

        def tell(rank: int, frame: dict) -> bool:
            self.told.append((rank, frame))
            return self.connected is None or rank in self.connected

        self.captures = Captures(self.records.append, tell, lambda node, frame: False, lambda rank: None, tmp_path, clock=lambda: self.now)


def test_the_supervisor_asks_the_ranks_refuses_a_second_capture_and_says_when_all_answered(tmp_path):
    state, sup = job_of(4), Supervisor(tmp_path)
    sup.captures.ask({"type": "command", "action": "profile", "ranks": [3, 0], "steps": 5}, state)
    started = sup.records[-1]
    assert (
        started["state"] == "started" and started["ranks"] == [0, 3] and "capturing 5 steps of ranks 0,3 from step 2 on" in started["text"]
    )
    told = [(rank, frame["steps"], frame["folder"], frame["from_step"]) for rank, frame in sup.told]
    assert told == [(0, 5, str(tmp_path), 2), (3, 5, str(tmp_path), 2)], "two steps ahead of ranks that have done none"
    sup.captures.ask({"type": "command", "action": "profile", "rank": 1}, state)
    assert sup.records[-1]["state"] == "refused" and "is under way" in sup.records[-1]["text"]
    sup.captures.observe({"type": "profile", "rank": 0, "wall": 0.0, "id": started["id"], "first_step": 9, "steps": 5, "path": "p"})
    assert sup.captures.flying is not None
    sup.captures.observe({"type": "rank_hello", "rank": 3, "restart": 1})
    done = sup.records[-1]
    assert done["state"] == "done" and done["text"].endswith("rank 0 captured; rank 3 restarted before its capture was done")
    assert sup.captures.flying is None


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ({"rank": 7}, "rank 7 is not running in this job (running: 0-3)"),
        ({"steps": 0}, "--steps 0: from 1 to 100"),
        ({"ranks": [1, 9], "steps": 500}, "--steps 500: from 1 to 100"),
    ],
)
def test_a_capture_of_what_is_not_there_is_refused_in_one_line(tmp_path, command, why):
    sup = Supervisor(tmp_path)
    sup.captures.ask({"type": "command", "action": "profile", **command}, job_of(4))
    assert sup.records[-1]["state"] == "refused" and sup.records[-1]["text"] == f"profile refused: {why}" and sup.told == []


def test_a_rank_that_never_answers_ends_the_capture_at_its_deadline(tmp_path):
    sup = Supervisor(tmp_path, connected={0})
    sup.captures.ask({"type": "command", "action": "profile"}, job_of(2))
    assert sup.captures.flying is not None and sup.captures.flying.answers == {1: "not connected"}
    sup.now += 10_000
    sup.captures.tick()
    assert sup.records[-1]["text"].endswith("rank 0 no answer within 180 s; rank 1 not connected")


def profile(rank: int, data: float, forward: float, comm: float, ops: list) -> dict:
    phases = {"data": data, "forward": forward, "backward": 10.0, "comm": comm, "overlap": 1.0, "optimizer": 2.0}
    phases["step"] = data + forward + 10.0 + comm + 2.0
    return {
        "type": "profile",
        "rank": rank,
        "wall": 0.0,
        "id": "c",
        "first_step": 40,
        "steps": 10,
        "path": f"/r/p{rank}",
        "phases": phases,
        "ops": ops,
    }


def test_what_differs_names_each_ranks_own_cause_against_the_median():
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    results = {
        0: profile(0, 1.0, 20.0, 5.0, [["aten::mm", 15.0, 0.0, 3], [loader, 0.5, 0.0, 1]]),
        1: profile(1, 1.2, 20.5, 5.1, [["aten::mm", 15.2, 0.0, 3], [loader, 0.6, 0.0, 1]]),
        2: profile(2, 42.0, 20.0, 5.0, [["aten::mm", 15.1, 0.0, 3], [loader, 41.5, 0.0, 1]]),
        3: profile(3, 1.1, 35.0, 5.0, [["aten::mm", 30.0, 0.0, 3], [loader, 0.5, 0.0, 1]]),
    }
    said = profiles.differences(results)
    assert said[2] == f"rank 2: +40.9 ms in data wait; {loader} +41.0 ms; the rest within 5%"
    assert said[3] == "rank 3: +14.8 ms in forward; aten::mm +14.9 ms; the rest within 5%"
    assert said[0] == "rank 0: within 5% of the median rank"
    capture = profiles.Capture("c", results=results)
    lines = profiles.summary_lines(capture)
    assert lines[0].startswith("rank 0: 10 steps from step 40, 38.0 ms a step: data wait 1.0, forward 20.0")
    assert "  trace: /r/p0" in lines and lines[-5].startswith("what differs from the median rank")
    assert profiles.differences({0: results[0]}) == {}, "one rank alone has nothing to differ from"
