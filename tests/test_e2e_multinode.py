"""Two nodes on one machine: two supervisors, one job of world size 4.

Each `ddptop launch --nnodes 2 --node-rank R` runs its own torchrun with 2
CPU ranks; they meet in torchrun's c10d rendezvous on 127.0.0.1. Node 0's
supervisor aggregates: one watchdog over all four ranks, one event log, one
dashboard, one Prometheus endpoint.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from support import DDPTOP, EXAMPLE, free_port, run_ddptop, until, wait_for
from test_tui import column, table

from ddptop.core import rundir
from ddptop.supervisor.cluster import remote
from ddptop.tui.app import DdptopApp
from ddptop.tui.screens.rank_detail import RankDetailScreen
from ddptop.tui.source import LiveSource

pytestmark = pytest.mark.slow

TOKEN = "the-job-token"


def records(run: Path) -> list[dict]:
    return list(rundir.read_events(rundir.RunDir(run))) if (run / "events.log").exists() else []


def prometheus_lines(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode().splitlines()


async def test_two_nodes_are_one_job_watched_restarted_and_shown_as_one(ddptop_home, tmp_path, monkeypatch):
    rdzv, prometheus = free_port(pair=True), free_port()
    monkeypatch.setenv("DDPTOP_TOKEN", TOKEN)
    env = {**os.environ}
    job = [
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        f"127.0.0.1:{rdzv}",
        "--desync-every",
        "10",
        "--max-restarts",
        "2",
        str(EXAMPLE),
        "--gpus",
        "2",
        "--steps",
        "600",
        "--inject",
        "desync@25:3/0",
        "--inject",
        "kill@60:2/0",
    ]

    def node(rank: int, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [DDPTOP, "launch", "--headless", "--run-dir", str(tmp_path / f"node{rank}"), "--node-rank", str(rank), *extra, *job],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    node1 = node(1, "--listen", "0")  # before node 0: it waits for node 0's supervisor to answer
    node0 = node(0, "--prometheus", f"127.0.0.1:{prometheus}")
    try:
        wait_for(
            lambda: (
                {(r["rank"], r["restart"]) for r in records(tmp_path / "node0") if r["type"] == "rank_hello"}
                >= {(rank, 1) for rank in range(4)}
            ),
            120,
            "all four ranks of both nodes in attempt 1, on node 0",
        )

        # A third supervisor claiming node rank 1 is refused before it starts anything.
        intruder = subprocess.run(
            [DDPTOP, "launch", "--headless", "--node-rank", "1", *job], capture_output=True, text=True, env=env, timeout=60
        )
        assert intruder.returncode == 2 and intruder.stderr.strip().splitlines() == [
            f"ddptop: error: node 0's supervisor at 127.0.0.1:{rdzv + 1} refused node 1: node rank 1 is already taken by {socket.gethostname()}"
        ]

        # Prometheus on node 0 shows every rank of both nodes, live.
        def every_rank_up() -> list[str]:
            up = [line for line in prometheus_lines(prometheus) if line.startswith("ddptop_rank_up{")]
            return up if len(up) == 4 and {'node="0"', 'node="1"'} <= {p for line in up for p in line.split(",")} else []

        up = wait_for(every_rank_up, 30, "ddptop_rank_up for 4 ranks on nodes 0 and 1")
        lines = prometheus_lines(prometheus)
        assert 'ddptop_alerts_total{kind="desync"} 1.0' in lines and 'ddptop_alerts_total{kind="crash"} 1.0' in lines
        assert "ddptop_restarts_total 1.0" in lines and "ddptop_world_size 4.0" in lines
        # A new attempt's step times are its own: they show from its first steps on.
        wait_for(
            lambda: any(
                line.startswith("ddptop_rank_step_seconds{") and 'quantile="0.95"' in line for line in prometheus_lines(prometheus)
            ),
            30,
            "the step time's quantiles of the attempt after the restart",
        )
        print(f"prometheus: {len(lines)} lines, e.g. {up[0]}")

        # Every rank's stacks from the shell, through node 0's supervisor: node 1's dumped on node 1.
        dumped = run_ddptop("stacks", f"127.0.0.1:{rdzv + 1}")
        assert dumped.returncode == 0, dumped.stdout + dumped.stderr
        assert sorted(re.findall(r"^==> rank (\d) \(", dumped.stdout, re.M)) == ["0", "1", "2", "3"], dumped.stdout

        # Of both nodes' supervisors, attach picks node 0's, which shows the whole job.
        node1_address = json.loads((tmp_path / "node1" / "meta.json").read_text())["listen"]
        target, notice = remote.choose(f"{node1_address},127.0.0.1:{rdzv + 1}", None)
        assert (target.port, notice) == (rdzv + 1, None)
        target, notice = remote.choose(node1_address, None)
        assert notice == f"none of {node1_address} is node 0's supervisor: showing node 1's ranks only"

        # One dashboard, attached over TCP with the token, shows both nodes' ranks.
        app = DdptopApp(LiveSource(tcp=("127.0.0.1", rdzv + 1), token=TOKEN), "attach")
        async with app.run_test(size=(180, 40)) as pilot:
            await until(
                lambda: table(app).row_count == 4 and sorted(column(app, "node")) == ["0", "0", "1", "1"],
                "four rows, two per node",
                timeout=20,
            )
            # Rank 3's log is read on its own node (node 1, local rank 1), which node 0 asks for it.
            detail = RankDetailScreen(app.state, 3, None, app.main.now, False)
            detail.live = detail.acting = True
            app.push_screen(detail)
            await until(lambda: app.state.ranks[3].log_tail is not None, "rank 3's log tail, from node 1", timeout=20)
            attempt = app.state.ranks[3].restart
            assert app.state.ranks[3].log_tail == rundir.own_log_tail(tmp_path / "node1", "torchrun", 1, attempt, 200)
            # Its stacks too, dumped on node 1 (D in the detail).
            await pilot.press("D")
            await until(lambda: app.state.ranks[3].stack is not None, "rank 3's stacks, from node 1", timeout=20)
            assert list((tmp_path / "node1" / "stacks").glob("rank3.*.txt")), "kept on the rank's own node"
    finally:
        outs = [proc.communicate(timeout=180) for proc in (node0, node1)]
    assert (node0.returncode, node1.returncode) == (0, 0), outs

    log = records(tmp_path / "node0")
    hellos = [r for r in log if r["type"] == "rank_hello"]
    assert {(r["rank"], r["restart"]) for r in hellos} == {(rank, attempt) for rank in range(4) for attempt in (0, 1)}
    assert {r["node"] for r in hellos} == {0, 1} and {r["world_size"] for r in hellos} == {4}
    # The watchdog on node 0 compared the ranks of both nodes, and named the killed one
    # once: the other node's ranks, failing of it a moment later, are not a second crash.
    [desync] = [a for a in log if a["type"] == "alert" and a["kind"] == "desync"]
    assert desync["ranks"] == [3] and desync["step"] == 30
    [crash] = [a for a in log if a["type"] == "alert" and a["kind"] == "crash"]
    # Killed before step 60's forward: its last step node 0 heard of lags by what
    # the SIGKILL cut from its sender's queue and the hop through node 1.
    killed = re.match(r"rank 2 was killed by SIGKILL after step (\d+)", crash["text"])
    assert killed and 30 <= int(killed[1]) <= 59, crash["text"]
    # torchrun's rendezvous restarted the group on both nodes, once each.
    assert sorted((r["node"], r["restart"]) for r in log if r["type"] == "group_restart") == [(0, 1), (1, 1)]
    # Both nodes' samples are in the one log, and every rank finished attempt 1.
    assert {r.get("node") for r in log if r["type"] == "sample"} == {0, 1}
    last = {}
    for r in log:
        if r["type"] == "step":
            last[r["rank"]] = r["step"]
    assert last == {rank: 599 for rank in range(4)}
    assert not [r for r in log if r["type"] == "wire_error"]


def test_srun_s_variables_alone_make_two_launches_one_job(ddptop_home, tmp_path):
    """What `srun ddptop launch train.py --gpus 2` does on two nodes: the same command line on
    each, with the variables srun sets; the rendezvous port is derived from the job id."""
    from ddptop.supervisor.cluster import slurm

    def bindable(port: int) -> bool:
        try:
            socket.create_server(("127.0.0.1", port)).close()
            socket.create_server(("127.0.0.1", port + 1)).close()
            return True
        except OSError:
            return False

    job_id = next(i for i in range(os.getpid() % slurm.PORT_SPAN, 10**6) if bindable(slurm.derived_port(i)))
    port = slurm.derived_port(job_id)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    env.update(SLURM_JOB_ID=str(job_id), SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="localhost", SLURM_LOCALID="0", DDPTOP_TOKEN=TOKEN)
    command = [DDPTOP, "launch", "--headless", str(EXAMPLE), "--gpus", "2", "--steps", "30"]
    nodes = [
        subprocess.Popen(
            [*command[:3], "--run-dir", str(tmp_path / f"node{n}"), *command[3:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "SLURM_NODEID": str(n)},
        )
        for n in (1, 0)
    ]
    try:
        outs = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outs]
    assert f"ddptop: SLURM job {job_id}: node 0 of 2, rendezvous at localhost:{port} (the first host of SLURM_JOB_NODELIST)" in outs[1][1]
    hellos = {(r["rank"], r["world_size"], r["node"]) for r in records(tmp_path / "node0") if r["type"] == "rank_hello"}
    assert {(rank, world) for rank, world, _ in hellos} == {(rank, 4) for rank in range(4)} and {node for *_, node in hellos} == {0, 1}
