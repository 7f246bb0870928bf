"""The package as a user installs it: the built wheel in a fresh venv, used from outside the checkout.

An editable install maps ddptop.<part> onto this checkout's folders, so a
module or data file the build leaves out is never missed there. These tests
build the sdist and the wheel, check that both carry every file of the
package, install the wheel (not editable, torch pinned as for development)
into a new venv, and from a directory outside the checkout import every
module, run a headless 2-rank job of a plain DDP script, and replay that run
in the real dashboard under Pilot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import REPO, SCRIPTS

# One worker builds the wheel and its venv (module fixtures) for all of them.
pytestmark = [pytest.mark.slow, pytest.mark.wheel, pytest.mark.xdist_group("wheel")]

PARTS = ("core", "supervisor", "trainer", "tui")
PACKAGE_FILES = (".py", ".tcss", ".typed")

IMPORT_ALL = """
import importlib, pkgutil, sys
import ddptop
names = ["ddptop"] + [m.name for m in pkgutil.walk_packages(ddptop.__path__, "ddptop.")]
for name in names:
    module = importlib.import_module(name)
    assert "site-packages" in module.__file__, (name, module.__file__)
print(len(names), "modules")
"""

REPLAY = """
import asyncio, sys
from ddptop.core import rundir
from ddptop.tui.app import DdptopApp
from ddptop.tui.source import ReplaySource
from ddptop.tui.widgets.rank_table import RankTable

async def main() -> None:
    run = rundir.find(sys.argv[1])
    app = DdptopApp(ReplaySource(run), "replay", run.path)
    async with app.run_test(size=(160, 40)) as pilot:
        for _ in range(600):  # a deadline of 30 s on the replay being drawn
            if app.state.exit is not None and app.query_one(RankTable).row_count == 2:
                break
            await pilot.pause(0.05)
        header = str(app.query_one("#header").render())
        print("rows", app.query_one(RankTable).row_count, "exit", app.state.exit and app.state.exit["code"])
        print("header", header.replace("\\n", " | "))

asyncio.run(main())
"""


def tracked_package_files() -> set[str]:
    """Every file of the package as the wheel names it: ddptop/<part>/... for each part's folder
    (ddptop/<part> is a link to it)."""
    listed = subprocess.run(["git", "ls-files", "ddptop", *PARTS], cwd=REPO, capture_output=True, text=True, check=True).stdout
    files = set()
    for path in listed.split():
        if path.endswith(PACKAGE_FILES):
            files.add(path if path.startswith("ddptop/") else f"ddptop/{path}")
    return files


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # The sdist first, then the wheel from the unpacked sdist (build's default): nothing left
    # in this checkout by an earlier build (build/lib) can stand in for a file the sdist lacks.
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed, not editable; torch pinned as for development."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    wheel = next(dist.glob("ddptop-*.whl"))
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-c", str(REPO / "constraints.txt"), str(wheel)], check=True, capture_output=True)
    return root


@pytest.fixture
def outside(tmp_path: Path) -> dict[str, str]:
    """The environment of a user in a directory of their own, far from this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "DDPTOP_HOME": str(tmp_path / "home")}


def test_the_wheel_and_the_sdist_carry_every_file_of_the_package(dist: Path) -> None:
    expected = tracked_package_files()
    assert "ddptop/tui/ddptop.tcss" in expected and "ddptop/trainer/bootstrap/sitecustomize.py" in expected
    with zipfile.ZipFile(next(dist.glob("ddptop-*.whl"))) as wheel:
        in_wheel = {name for name in wheel.namelist() if name.startswith("ddptop/")}
    assert expected - in_wheel == set()
    with tarfile.open(next(dist.glob("ddptop-*.tar.gz"))) as sdist:  # the parts' files under ddptop/, where its links lead
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert expected - in_sdist == set()


def test_every_module_imports_from_the_installed_package(venv: Path, outside: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run([str(venv / "bin" / "python"), "-c", IMPORT_ALL], cwd=tmp_path, env=outside, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[0]) >= 80


def test_a_headless_job_then_its_replay_in_the_dashboard(venv: Path, outside: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "plain_ddp.py").read_text())
    run_dir = tmp_path / "run"
    job = subprocess.run(
        [str(venv / "bin" / "ddptop"), "launch", "--headless", "train.py", "--gpus", "2", "--run-dir", str(run_dir), "--steps", "20"],
        cwd=tmp_path,
        env=outside,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert json.loads((run_dir / "meta.json").read_text())["state"] == "finished"
    export = subprocess.run([str(venv / "bin" / "ddptop"), "export", str(run_dir)], env=outside, capture_output=True, text=True, check=True)
    steps = [r for line in export.stdout.splitlines() if (r := json.loads(line))["type"] == "step"]
    # Zero-code instrumentation from the installed bootstrap: both ranks, every step, DDP's sampled comm time.
    assert {(r["rank"], r["step"]) for r in steps} == {(rank, step) for rank in (0, 1) for step in range(20)}
    assert any(r.get("comm_ms") is not None for r in steps)

    replay = subprocess.run(
        [str(venv / "bin" / "python"), "-c", REPLAY, str(run_dir)], cwd=tmp_path, env=outside, capture_output=True, text=True, timeout=120
    )
    assert replay.returncode == 0, replay.stderr
    assert "rows 2 exit 0" in replay.stdout and "train.py" in replay.stdout, replay.stdout


def test_launch_works_from_inside_the_checkout(venv: Path, outside: dict[str, str], tmp_path: Path) -> None:
    """A user who clones ddptop and `pip install .`s it runs it from the clone: Python puts the
    working folder first for `python -c` and `python -m`, so what ddptop starts there (torchrun's
    probe, the template) imports the checkout's ddptop/, which is the whole package too."""
    run_dir = tmp_path / "run"
    job = subprocess.run(
        [str(venv / "bin" / "ddptop"), "launch", "--headless", str(SCRIPTS / "plain_ddp.py"), "--gpus", "2", "--run-dir", str(run_dir), "--steps", "5"],
        cwd=REPO,
        env=outside,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    assert json.loads((run_dir / "meta.json").read_text())["state"] == "finished"
    assert "ALERT" not in job.stderr, job.stderr


def test_the_checkout_s_root_is_the_package_too(venv: Path, outside: dict[str, str]) -> None:
    """From the checkout's root Python finds its ddptop/ folder before the installed package: that
    folder is the whole package (its parts linked in), so the parts import and `python -m ddptop` runs."""
    python = str(venv / "bin" / "python")
    imported = subprocess.run(
        [python, "-c", "import ddptop.trainer, ddptop.tui, ddptop.supervisor.launch"], cwd=REPO, env=outside, capture_output=True, text=True
    )
    assert imported.returncode == 0, imported.stderr
    listed = subprocess.run([python, "-m", "ddptop", "ls"], cwd=REPO, env=outside, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr


def test_without_torch_launch_says_so_in_one_line(venv: Path, outside: dict[str, str], tmp_path: Path) -> None:
    """Last in this module: it takes torch out of the venv the others use."""
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "torch"], check=True, capture_output=True)
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "plain_ddp.py").read_text())
    result = subprocess.run(
        [str(venv / "bin" / "ddptop"), "launch", "--headless", "train.py", "--gpus", "2"],
        cwd=tmp_path,
        env=outside,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "torch is not installed" in result.stderr, result.stderr
