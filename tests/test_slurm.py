"""A job's nodes from SLURM's variables: what each launch takes, what the command line keeps,
and variables that cannot be right, refused in one line."""

from __future__ import annotations

import pytest

from ddptop.core.usage import UsageError
from ddptop.supervisor.cluster import slurm
from ddptop.supervisor.launching.args import split

SRUN = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_NODEID": "2",
    "SLURM_JOB_NODELIST": "gpu[07,01-03]",
    "SLURM_LOCALID": "0",
}


def taken(env: dict[str, str], *argv: str) -> tuple:
    opts = split([*argv, "train.py"]).options
    opts, said = slurm.apply(opts, env)
    return opts.nnodes, opts.node_rank, opts.rdzv_endpoint, opts.rdzv_id, said


def test_srun_s_variables_make_the_node_s_place():
    port = slurm.derived_port(123456)
    assert port == 20000 + 2 * 3456
    assert taken(SRUN) == (
        "4",
        2,
        f"gpu07:{port}",
        "123456",
        f"SLURM job 123456: node 2 of 4, rendezvous at gpu07:{port} (the first host of SLURM_JOB_NODELIST)",
    )


def test_master_addr_and_port_name_the_rendezvous_and_the_command_line_wins():
    env = {**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "29500"}
    assert taken(env)[2] == "head:29500"
    assert taken(env, "--rdzv-endpoint", "other:1234", "--node-rank", "0")[1:3] == (0, "other:1234")


def test_no_slurm_or_one_node_changes_nothing():
    assert taken({}) == (None, None, None, None, None)
    assert taken({**SRUN, "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0"}) == (None, None, None, None, None)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"SLURM_NODEID": "4"}, "SLURM_NODEID=4 is not below SLURM_JOB_NUM_NODES=4"),
        ({"SLURM_JOB_NODELIST": "gpu[01-"}, "SLURM_JOB_NODELIST='gpu[01-' is not a hostlist"),
        ({"SLURM_JOB_NUM_NODES": "four"}, "SLURM_JOB_NUM_NODES='four' is not a number"),
        ({"SLURM_LOCALID": "1"}, "run one per node (srun --ntasks-per-node=1)"),
    ],
)
def test_variables_that_cannot_be_right_are_one_line(change, error):
    with pytest.raises(UsageError, match=error.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        taken({**SRUN, **change})
