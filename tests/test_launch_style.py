"""How a script starts its ranks, read from its source: the three styles tutorials teach,
what decides between them, and where a script sets its own port. Nothing is executed."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import hello

from ddptop.core.policy import Started, WatchPolicy
from ddptop.supervisor.launching.style import chosen, detect
from ddptop.supervisor.watching.failures import port_in_use
from ddptop.supervisor.watching.rules.self_started import NO_RANK_S, SelfStartedRule

TUTORIAL = """
import os
import torch.distributed as dist
import torch.multiprocessing as mp

def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    dist.init_process_group("nccl", rank=rank, world_size=world_size)

if __name__ == "__main__":
    mp.spawn(setup, args=(4,), nprocs=4, join=True)
"""


def style_of(tmp_path: Path, source: str) -> tuple[str, str, str | None]:
    script = tmp_path / "train.py"
    script.write_text(source)
    found = detect(script)
    return found.name, found.reason, found.port_set_at


def test_the_ddp_tutorial_s_spawn_script_and_where_it_sets_its_port(tmp_path):
    assert style_of(tmp_path, TUTORIAL) == (
        "spawn",
        "train.py starts its own ranks with torch.multiprocessing.spawn (line 12)",
        "train.py:8",
    )


@pytest.mark.parametrize(
    "source",
    [
        "from torch.multiprocessing import spawn\nspawn(f, nprocs=2)\n",
        "import torch.multiprocessing as tmp\ntmp.start_processes(f, nprocs=2, start_method='fork')\n",
        "import torch\ntorch.multiprocessing.spawn(f, nprocs=2)\n",
        "from torch import multiprocessing as mp\nmp.spawn(f, nprocs=2)\n",
        "import multiprocessing as mp, torch.distributed as dist\n"
        "def f(r):\n    dist.init_process_group('gloo', rank=r, world_size=2)\n"
        "ps = [mp.Process(target=f, args=(r,)) for r in range(2)]\n",
    ],
)
def test_every_way_of_starting_ranks_from_the_script_is_spawn(tmp_path, source):
    assert style_of(tmp_path, source)[0] == "spawn"


@pytest.mark.parametrize(
    ("source", "style"),
    [
        ("import torch\nmodel = torch.nn.DataParallel(net)\n", "single"),
        ("from torch.nn import DataParallel\nm = DataParallel(net).cuda()\n", "single"),
        ("import torch.distributed as dist\ndist.init_process_group('nccl')\nDistributedDataParallel(net)\n", "torchrun"),
        # A script that runs either way (reads torchrun's variables, else spawns) is torchrun's.
        (
            "import os, torch.multiprocessing as mp\nif 'LOCAL_RANK' in os.environ:\n    main()\nelse:\n    mp.spawn(main, nprocs=2)\n",
            "torchrun",
        ),
        # A worker pool for data, not ranks: no rank given to init_process_group.
        ("import multiprocessing\np = multiprocessing.Process(target=load)\n", "torchrun"),
        ("print('hello')\n", "torchrun"),
    ],
)
def test_data_parallel_is_single_and_everything_else_torchrun(tmp_path, source, style):
    assert style_of(tmp_path, source)[0] == style


def test_detection_never_runs_the_script(tmp_path):
    marker = tmp_path / "ran"
    assert style_of(tmp_path, f"open({str(marker)!r}, 'w').write('x')\nimport torch.multiprocessing as mp\nmp.spawn(f)\n")[0] == "spawn"
    assert not marker.exists()


def test_the_override_wins_and_says_what_was_detected(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TUTORIAL)
    forced = chosen(script, "torchrun")
    assert (forced.name, forced.reason, forced.port_set_at) == ("torchrun", "--launch-style torchrun (detected: spawn)", "train.py:8")
    assert chosen(script, "auto").name == "spawn"


def test_a_port_in_use_is_read_from_torch_s_error():
    text = "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: 12355, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    assert port_in_use(text) == 12355
    assert port_in_use("RuntimeError: boom at port: 12355") is None


def test_a_self_started_world_other_than_the_gpus_given_is_said_once():
    rule = SelfStartedRule(WatchPolicy(started=Started("spawn", "train.py", gpus=2)))
    said = [v.text for r in range(4) for v in rule.observe(hello(r, 4), 0.0)]
    assert said == ["train.py runs 4 ranks but was given 2 GPUs (--gpus 2)"]
    assert SelfStartedRule(WatchPolicy(started=Started("spawn", "train.py", gpus=4))).observe(hello(0, 4), 0.0) == []
    assert SelfStartedRule(WatchPolicy(started=Started("torchrun", "train.py", gpus=2))).observe(hello(0, 4), 0.0) == []


def test_a_self_starting_script_with_no_rank_is_said_so_not_left_to_hang():
    rule = SelfStartedRule(WatchPolicy(started=Started("spawn", "train.py")))
    assert rule.tick(100.0) == [] and rule.tick(100.0 + NO_RANK_S - 1) == []
    waiting = rule.tick(100.0 + NO_RANK_S)
    assert [(v.kind, v.notice) for v in waiting] == [("no-ranks", True)] and "init_process_group" in waiting[0].text
    assert rule.tick(500.0) == []  # once
    assert "ended" in rule.final()[0].text
    started = SelfStartedRule(WatchPolicy(started=Started("spawn", "train.py")))
    started.observe(hello(0, 2), 0.0)
    assert started.tick(1000.0) == [] and started.final() == []
