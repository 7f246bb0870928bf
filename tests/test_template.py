"""The template's rules, and what it imports: no CUDA, no thread, before any fork."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
