"""The template's rules, and what it imports: no CUDA, no thread, before any fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from support import wait_for

from ddptop.supervisor.launching.template import Template
from ddptop.supervisor.launching.torchrun import BOOTSTRAP_DIR
from ddptop.trainer.template import fit

PY = sys.executable
ENV = {"PATH": "/usr/bin", "PYTHONPATH": "/boot", "OMP_NUM_THREADS": "1"}


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def misfit(argv, env=ENV, cwd="/", imported=("torch", "numpy")):
    return fit.misfit(argv, env, cwd, ENV, set(imported))


BECOME = (
    "import os, sys; from ddptop.trainer.template import child; "
    "child.become(child.Request([sys.executable, 'train.py'], dict(os.environ), os.getcwd(), [], int(sys.argv[1]))); print('alive')"
)


def test_a_child_whose_template_ended_before_it_became_a_rank_ends_itself():
    """The template can be killed between its fork and the child's arming of the parent-death
    signal (the supervisor killed, and the kill running down torchrun and the template): the child
    must then end itself, not run on as an orphan, whose parent reads as 1 by then."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = subprocess.run([PY, "-c", BECOME, str(gone.pid)], capture_output=True, text=True, timeout=60)
    assert orphan.returncode == -9 and orphan.stdout == "", orphan.stderr[-2000:]
    parented = subprocess.run([PY, "-c", BECOME, str(os.getpid())], capture_output=True, text=True, timeout=60)
    assert parented.stdout == "alive\n", parented.stderr[-2000:]


def test_a_script_or_a_module_under_this_python_is_forked(script):
    assert misfit([PY, "-u", str(script), "--lr", "3"]) is None
    assert misfit([PY, "-u", "train.py"], cwd=str(script.parent)) is None
    assert misfit([PY, "-u", "-m", "train", "--x"], cwd=str(script.parent)) is None
    found = fit.command([PY, "-u", "-m", "pkg.train", "--x"])
    assert found == fit.Command("pkg.train", ["--x"], module=True)
    assert found.folder("/work") == "/work"
    assert fit.command([PY, "-u", str(script)]).folder("/") == str(script.parent)


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/bin/numactl", "-N", "0", PY, "-u", "t.py"],
        ["./train.sh"],
        [PY, "t.py"],
        [PY, "-u", "-c", "pass"],
        ["/other/python", "-u", "t.py"],
    ],
)
def test_anything_but_this_python_running_a_script_starts_plain(argv):
    assert "not this Python running a script" in misfit(argv)


def test_a_variable_read_at_start_up_that_differs_starts_plain(script):
    argv = [PY, "-u", str(script)]
    per_worker = {
        "RANK": "1",
        "MASTER_PORT": "2",
        "TORCHELASTIC_RUN_ID": "x",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "DDPTOP_AGENT_PID": "9",
    }
    assert misfit(argv, {**ENV, **per_worker, "CUDA_VISIBLE_DEVICES": "1"}) is None
    assert "OMP_NUM_THREADS" in misfit(argv, {**ENV, "OMP_NUM_THREADS": "4"})
    assert "LD_PRELOAD, PYTHONHASHSEED" in misfit(argv, {**ENV, "LD_PRELOAD": "x.so", "PYTHONHASHSEED": "0"})
    assert "PYTHONPATH" in misfit(argv, {k: v for k, v in ENV.items() if k != "PYTHONPATH"})


def test_a_module_in_the_scripts_folder_that_the_template_imported_starts_plain(script):
    argv = [PY, "-u", str(script)]
    (script.parent / "numpy.py").write_text("")
    assert "has its own numpy" in misfit(argv)
    (script.parent / "numpy.py").unlink()
    (script.parent / "torch").mkdir()  # a folder of checkpoints, not a package: no shadow
    assert misfit(argv) is None
    (script.parent / "torch" / "__init__.py").write_text("")
    assert "has its own torch" in misfit(argv)


def test_a_missing_script_starts_plain_so_python_says_so_itself(tmp_path):
    assert "is not a file" in misfit([PY, "-u", str(tmp_path / "gone.py")])


WARM_CHECK = """
import json, sys, threading
import torch
calls = []
def refuse(*args, **kwargs):
    calls.append("cuda")
    raise AssertionError("CUDA initialised")
torch.cuda._lazy_init = refuse
torch.cuda.init = refuse
from ddptop.trainer.template import server
blocker = server.warm()
print(json.dumps({"blocker": blocker, "calls": calls, "initialized": torch.cuda.is_initialized(),
                  "threads": threading.active_count(), "dynamo": "torch._dynamo" in sys.modules}))
"""


@pytest.mark.slow  # a fresh interpreter imports torch and torch._dynamo: seconds
@pytest.mark.oldest
@pytest.mark.cuda  # and without a GPU: it holds on both, and on a GPU host it is the check that matters
def test_the_template_imports_torch_without_initialising_cuda_or_starting_a_thread():
    """A forked CUDA context would break every rank; a forked thread would be a stopped copy."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([BOOTSTRAP_DIR, os.environ.get("PYTHONPATH", "")])}
    env.pop("DDPTOP_ADDRESS", None)
    out = subprocess.run([PY, "-c", WARM_CHECK], capture_output=True, text=True, timeout=120, check=True, env=env).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"blocker": None, "calls": [], "initialized": False, "threads": 1, "dynamo": True}


def process_state(pid: int) -> str | None:
    """The state letter of a process (Z: a zombie), None once it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return None


@pytest.mark.slow  # a real template imports torch: seconds
def test_a_forked_rank_that_exits_stays_a_zombie_until_torchrun_s_side_heard_so_its_group_can_be_signalled(tmp_path):
    """torchrun stops the workers it has not seen exit with os.killpg(pid). Two ranks that fail
    together: the second can exit before torchrun hears of it, and a template that had reaped
    it made that killpg fail (ESRCH), which ended torchrun with a traceback (seen in CI)."""
    script = tmp_path / "train.py"
    script.write_text("import sys; sys.exit(2)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([BOOTSTRAP_DIR, os.environ.get("PYTHONPATH", "")])}
    env.pop("DDPTOP_ADDRESS", None)
    template = Template.start(env)
    try:
        with open(os.devnull, "r+") as null:
            forked = template.fork([PY, "-u", str(script)], env, [null.fileno()] * 3)
        assert not isinstance(forked, str), forked
        wait_for(lambda: process_state(forked.pid) == "Z", timeout=60, what="the rank to exit, unreaped")
        os.killpg(forked.pid, signal.SIGTERM)  # what torchrun does to a worker whose exit it has not heard of
        assert forked.wait(timeout=30) == 2
        wait_for(lambda: process_state(forked.pid) is None, timeout=30, what="the template to reap it once heard")
    finally:
        template.proc.kill()
        template.proc.wait()
