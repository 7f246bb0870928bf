"""Ranks forked from the template behave as ranks torchrun starts, on real gloo jobs.

Each test runs the same script with the template (the default) and with
--no-template, and compares what the ranks saw, did or said.
"""

from __future__ import annotations

import colorsys
import json
import re
from pathlib import Path

import pytest
from support import SCRIPTS, recorded, run_ddptop

from ddptop.core import rundir
from ddptop.trainer.template import MARK

pytestmark = pytest.mark.slow

PLAIN_NOTE = "ranks start the plain way"


def launch(tmp_path: Path, name: str, script: Path, *args: str, template: bool = True) -> tuple[object, rundir.RunDir]:
    run_path = tmp_path / f"run-{name}"
    flags = [] if template else ["--no-template"]
    proc = run_ddptop("launch", "--headless", "--max-restarts", "0", *flags, "--run-dir", str(run_path), str(script), "--gpus", "2", *args)
    return proc, rundir.RunDir(run_path)


def said_plain(run: rundir.RunDir) -> list[str]:
    """What the run said of ranks that could not be forked from the template."""
    return [r["text"] for r in recorded(run) if r["type"] == "notice" and PLAIN_NOTE in r["text"]]


RUN_SPECIFIC = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "DDPTOP_AGENT_PID", "DDPTOP_RANK_PID", "DDPTOP_NO_TEMPLATE")


def normalised(seen: dict, run: rundir.RunDir, out: Path) -> dict:
    """What a rank saw, less what differs between any two runs (ports, ids, the run's own folders)."""
    text = json.dumps({**seen, "env": {k: v for k, v in seen["env"].items() if k not in RUN_SPECIFIC}})
    text = text.replace(str(run.path), "RUN").replace(str(out), "OUT")
    text = re.sub(r"logs/[^/]+/attempt_", "logs/ID/attempt_", text)
    text = re.sub(r"torchelastic_[a-z0-9_]+", "torchelastic_ID", text)
    return json.loads(text)


def test_a_forked_rank_sees_what_a_rank_torchrun_starts_sees(ddptop_home, tmp_path):
    seen = {}
    for template in (True, False):
        out = tmp_path / f"seen-{template}"
        out.mkdir()
        proc, run = launch(tmp_path, str(template), SCRIPTS / "identity.py", str(out), "--flag", "two words", template=template)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not said_plain(run)
        seen[template] = [normalised(json.loads((out / f"rank{r}.json").read_text()), run, out) for r in (0, 1)]
    for rank in (0, 1):
        fork, plain = seen[True][rank], seen[False][rank]
        assert MARK in fork.pop("parent") and "torchrun_probe" in plain.pop("parent")
        differ = {key for key in fork if fork[key] != plain[key]}
        env = {k for k in fork["env"].keys() | plain["env"].keys() if fork["env"].get(k) != plain["env"].get(k)}
        assert fork == plain, (rank, differ, {k: (fork["env"].get(k), plain["env"].get(k)) for k in env})
    first = seen[True][0]
    assert first["name"] == "__main__" and first["main"] and first["session"]
    assert first["argv"] == [str(SCRIPTS / "identity.py"), "OUT", "--flag", "two words"]
    assert first["path"][0] == str(SCRIPTS)
    assert first["stdio"][1].endswith("attempt_0/0/stdout.log")
    assert first["draws_apart"] == [True, True], "each rank's torch and random draw numbers of their own"


def test_dataloader_workers_by_fork_and_spawn_and_multiprocessing_work_as_under_torchrun(ddptop_home, tmp_path):
    lines = {}
    for template in (True, False):
        proc, run = launch(tmp_path, str(template), SCRIPTS / "loader_workers.py", template=template)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not said_plain(run)
        parents = re.findall(r"rank \d started by (.*)", proc.stdout)
        assert len(parents) == 2 and all((MARK in parent) is template for parent in parents), parents
        lines[template] = sorted(re.findall(r"rank \d: .*", proc.stdout))
    assert lines[True] == lines[False] == [f"rank {r}: fork 1240 spawn 1240 mp 42 mine" for r in (0, 1)]


def test_a_script_the_template_cannot_start_exactly_starts_plain_and_says_so_once(ddptop_home, tmp_path):
    script = tmp_path / "loader_workers.py"
    script.write_text((SCRIPTS / "loader_workers.py").read_text())
    # A copy of a module torch imports, beside the script: a rank started plain imports this one.
    (tmp_path / "colorsys.py").write_text(Path(colorsys.__file__).read_text())
    proc, run = launch(tmp_path, "shadowed", script)
    said = said_plain(run)
    assert len(said) == 1 and "has its own colorsys" in said[0], said
    assert proc.stderr.count(PLAIN_NOTE) == 1
    assert proc.returncode == 0 and not re.findall(f"started by .*{MARK}", proc.stdout), proc.stderr[-3000:]


BROKEN = {
    # ddptop refuses a script that does not parse before it starts anything: the error is in what it imports.
    "syntax error": ("import os\nimport helper\n", "def broken(:\n    pass\n"),
    "missing module": ("import os\nimport a_module_nobody_has\n", ""),
}


@pytest.mark.parametrize("fault", list(BROKEN))
def test_a_script_that_cannot_start_fails_as_it_does_under_torchrun(ddptop_home, tmp_path, fault):
    script = tmp_path / "broken.py"
    script.write_text(BROKEN[fault][0])
    (tmp_path / "helper.py").write_text(BROKEN[fault][1])
    said = {}
    for template in (True, False):
        proc, _run = launch(tmp_path, str(template), script, template=template)
        crash = [line for line in proc.stderr.splitlines() if line.startswith("ddptop: ALERT crash")]
        assert len(crash) == 1, proc.stderr[-3000:]
        said[template] = (proc.returncode, re.sub(r"rank \d", "rank N", crash[0]))
    assert said[True] == said[False]
    assert ("SyntaxError" if fault == "syntax error" else "No module named 'a_module_nobody_has'") in said[True][1]
