"""The `ddptop` command as a user runs it: bad input, ls, export."""

import json
import os

import psutil
import pytest

from ddptop.supervisor import rundir

from conftest import EXAMPLE, run_ddptop


def assert_one_line_error(result, fragment: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("ddptop: error: ") and fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["launch", "missing.py", "--gpus", "2"], "no such script: missing.py"),
        (["launch", "--bogus", str(EXAMPLE)], "unknown option --bogus"),
        (["launch", str(EXAMPLE), "--gpus", "0"], "--gpus"),
        (["launch", "--gpus", "2"], "no training script"),
        (["frobnicate"], "unknown command"),
        (["export", "no-such-run"], "no run matches"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(ddptop_home, args, fragment):
    assert_one_line_error(run_ddptop(*args), fragment)


def test_a_script_that_is_not_python(ddptop_home, tmp_path):
    script = tmp_path / "model.bin"
    script.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    assert_one_line_error(run_ddptop("launch", str(script), "--gpus", "2"), "is not a Python script")


def test_a_run_dir_that_cannot_be_written(ddptop_home, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_ddptop("launch", "--run-dir", str(blocker / "run"), str(EXAMPLE), "--gpus", "2")
    assert_one_line_error(result, "cannot use run directory")
    assert not any("torch.distributed.run" in " ".join(p.info["cmdline"] or []) and str(blocker) in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


def test_ls_and_export_read_run_directories(ddptop_home, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("")
    run = rundir.create(script, None)
    run.write_meta({"id": run.id, "script": str(script), "nproc_per_node": 4, "started": 1.0, "state": "running", "supervisor_pid": 2**22 + 7})
    log = rundir.EventLog(run.events_path)
    log.append({"type": "step", "rank": 0, "step": 0, "wall": 1.0, "step_ms": 2.0})
    log.close()
    listed = json.loads(run_ddptop("ls", "--json").stdout)
    assert [(r["id"], r["state"], r["ranks"]) for r in listed] == [(run.id, "failed", 4)]  # its supervisor is gone
    assert run.id in run_ddptop("ls").stdout
    exported = run_ddptop("export", run.id[:12]).stdout.splitlines()
    assert [json.loads(line)["type"] for line in exported] == ["step"]
    assert os.stat(run.path).st_mode & 0o777 == 0o700
