"""The sitecustomize bootstrap in real interpreters (no torch: these stay fast)."""

import os
import subprocess
import sys

from ddptop.supervisor.launching.torchrun import BOOTSTRAP_DIR

PROBE = "import sys; print(sorted(m for m in ('ddptop.trainer.runtime', 'torch', 'user_site_ran') if m in sys.modules))"


def python(code: str, env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DDPTOP_") and k not in ("RANK", "PYTHONPATH")}
    result = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_inert_without_a_supervisor():
    assert python(PROBE, {"PYTHONPATH": BOOTSTRAP_DIR, "RANK": "0"}) == "[]"


def test_inert_in_a_non_rank_process_such_as_torchrun_itself():
    assert python(PROBE, {"PYTHONPATH": BOOTSTRAP_DIR, "DDPTOP_ADDRESS": "unix:/nonexistent"}) == "[]"


def test_active_in_a_rank_without_importing_torch():
    env = {"PYTHONPATH": BOOTSTRAP_DIR, "DDPTOP_ADDRESS": "unix:/nonexistent", "RANK": "0"}
    assert python(PROBE, env) == "['ddptop.trainer.runtime']"


def test_inert_in_a_subprocess_that_a_rank_starts():
    env = {"PYTHONPATH": BOOTSTRAP_DIR, "DDPTOP_ADDRESS": "unix:/nonexistent", "RANK": "0", "DDPTOP_RANK_PID": "1"}
    assert python(PROBE, env) == "[]"


def test_chains_to_the_sitecustomize_it_shadows(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys, types\nsys.modules['user_site_ran'] = types.ModuleType('x')\n")
    env = {"PYTHONPATH": os.pathsep.join([BOOTSTRAP_DIR, str(tmp_path)])}
    assert python(PROBE, env) == "['user_site_ran']"
    env.update(DDPTOP_ADDRESS="unix:/nonexistent", RANK="0")
    assert python(PROBE, env) == "['ddptop.trainer.runtime', 'user_site_ran']"


def test_monitor_api_is_a_no_op_without_a_supervisor():
    code = (
        "from ddptop.trainer import monitor; monitor.configure(total_steps=5); monitor.step(loss=1.0, samples=3); print(monitor.enabled())"
    )
    assert python(code, {}) == "False"


def test_a_rank_whose_torchrun_is_already_gone_ends_itself():
    """The parent-death signal cannot fire for a parent that died before it was armed."""
    code = "from ddptop.trainer.runtime import die_with_parent; die_with_parent(); print('alive')"
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "DDPTOP_AGENT_PID": str(gone.pid)}, capture_output=True, text=True, timeout=30
    )
    assert orphan.returncode == -9 and orphan.stdout == ""
    parent_alive = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "DDPTOP_AGENT_PID": str(os.getpid())}, capture_output=True, text=True, timeout=30
    )
    assert parent_alive.stdout == "alive\n"
