"""The `ddptop` command as a user runs it: bad input, ls, export."""

import json
import math
import os
import shutil
import socket
import subprocess
import threading
import time

import builders
import psutil
import pytest
from support import DDPTOP, EXAMPLE, bound_unix, run_ddptop

from ddptop import stacks
from ddptop.control import Connection
from ddptop.core import rundir, wire
from ddptop.core.eventlog import EventLog
from ddptop.core.model import snapshot
from ddptop.core.model.history import pack
from ddptop.core.model.job import JobState
from ddptop.core.wire import records
from ddptop.core.wire.frames import FrameDecoder


def assert_one_line_error(result, fragment: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("ddptop: error: ") and fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["launch", "missing.py", "--gpus", "2"], "no such script: missing.py"),
        (["launch", str(EXAMPLE.parent), "--gpus", "2"], "examples is a directory: give the training script in it"),
        (["launch", "--bogus", str(EXAMPLE)], "unknown option --bogus"),
        (["launch", str(EXAMPLE), "--gpus", "0"], "--gpus"),
        (["launch", "--gpus", "2"], "no training script"),
        (["frobnicate"], "unknown command"),
        (["export", "no-such-run"], "no run matches"),
        (["launch", "--on-nan", "ignore", str(EXAMPLE)], "invalid choice: 'ignore'"),
        (["launch", "--on-desync", "skip", str(EXAMPLE)], "invalid choice: 'skip'"),
        (["launch", "--on-hang", "warn", str(EXAMPLE)], "invalid choice: 'warn'"),
        (["launch", "--hang-timeout", "-5", str(EXAMPLE)], "--hang-timeout"),
        (["launch", "--clip-grad", "0", str(EXAMPLE)], "--clip-grad"),
        (["launch", "--desync-every", "-1", str(EXAMPLE)], "--desync-every"),
        (["launch", "--restart-backoff", "-1", str(EXAMPLE)], "--restart-backoff"),
        (["launch", "--restart-backoff", "nan", str(EXAMPLE)], "--restart-backoff"),
        (["launch", "--crash-loop", "0", str(EXAMPLE)], "--crash-loop"),
        (["launch", "--crash-loop-window", "0", str(EXAMPLE)], "--crash-loop-window"),
        (["stacks"], "no running job of yours to dump the stacks of"),
        (["stacks", "--ranks", "0,x"], "'0,x': ranks as 0,3"),
        (["stacks", "--rank", "0", "--all"], "not allowed with argument --rank"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(ddptop_home, args, fragment):
    assert_one_line_error(run_ddptop(*args), fragment)


@pytest.mark.parametrize("args", [[], ["launch"]])
def test_no_command_or_no_script_prints_the_usage_and_fails(ddptop_home, args):
    result = run_ddptop(*args)
    assert result.returncode == 2 and result.stdout.startswith("usage: ddptop launch"), result


@pytest.mark.parametrize("args", [["--help"], ["launch", "--help"], ["ls"]])
def test_a_reader_that_went_away_ends_the_output_quietly(ddptop_home, args):
    """`ddptop --help | head -1`: the pipe's reader closes before ddptop has written; here, before it starts."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([DDPTOP, *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_a_script_that_is_not_python(ddptop_home, tmp_path):
    script = tmp_path / "model.bin"
    script.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    assert_one_line_error(run_ddptop("launch", str(script), "--gpus", "2"), "is not a Python script")


def test_a_run_dir_that_cannot_be_written(ddptop_home, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_ddptop("launch", "--run-dir", str(blocker / "run"), str(EXAMPLE), "--gpus", "2")
    assert_one_line_error(result, "cannot use run directory")
    assert not any(
        "torch.distributed.run" in " ".join(p.info["cmdline"] or []) and str(blocker) in " ".join(p.info["cmdline"] or [])
        for p in psutil.process_iter(["cmdline"])
    )


def test_ls_and_export_read_run_directories(ddptop_home, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("")
    run = rundir.create(script, None)
    run.write_meta(
        {"id": run.id, "script": str(script), "nproc_per_node": 4, "started": 1.0, "state": "running", "supervisor_pid": 2**22 + 7}
    )
    log = EventLog(run.events_path)
    log.append({"type": "step", "rank": 0, "step": 0, "wall": 1.0, "step_ms": 2.0})
    log.append({"type": "summary", "wall": 2.0, "metrics": {}, "rank_step_ms": pack([2.0, math.nan])})
    log.close()
    listed = json.loads(run_ddptop("ls", "--json").stdout)
    assert [(r["id"], r["state"], r["ranks"]) for r in listed] == [(run.id, "failed", 4)]  # its supervisor is gone
    assert run.id in run_ddptop("ls").stdout
    exported = run_ddptop("export", run.id[:12]).stdout.splitlines()
    assert [json.loads(line)["type"] for line in exported] == ["step", "summary"]
    assert json.loads(exported[1])["rank_step_ms"] == [2.0, None]  # a rank with no step in that second
    assert os.stat(run.path).st_mode & 0o777 == 0o700


def test_ls_gives_a_running_jobs_steps_as_logged_not_as_last_saved(ddptop_home, tmp_path):
    """The supervisor saves the job's state every 30 s or more: a job's first half minute had no
    steps in `ddptop ls`, and later ones showed steps that far behind. Its log has them now."""
    run = _fake_run(tmp_path, "running", os.getpid())  # a live supervisor
    log = EventLog(run.events_path)
    for step in range(40):
        log.append({"type": "step", "rank": 0, "step": step, "wall": 1.0 + step, "step_ms": 2.0})
    log.close()
    (row,) = json.loads(run_ddptop("ls", "--json").stdout)
    assert (row["state"], row["steps"], row["ended"]) == ("running", 40, None)
    assert run_ddptop("ls").stdout.splitlines()[1].split()[6] == "40"


@pytest.mark.parametrize("supervisor", ["live", "gone"])
def test_ls_gives_the_goodput_of_a_running_job_and_of_one_whose_supervisor_died(ddptop_home, tmp_path, supervisor):
    """A job that ended in order has its goodput in meta.json; one still running, or whose
    supervisor died before it could say, has it from its log, as its dashboard's header shows it:
    here 2 s of start-up, then 40 steps of 1 s (40 of 42 s, 95%), up to now or to its last record."""
    run = _fake_run(tmp_path, "running", os.getpid() if supervisor == "live" else 2**22 + 7)
    start = time.time() - 42.0
    log = EventLog(run.events_path)
    log.append(builders.build("run", wall=start, id=run.id, script="job.py"))
    log.append(builders.hello(0, 2))
    for n in range(40):
        log.append(builders.step(0, n, wall=start + 3.0 + n, step_ms=1000.0))
    log.close()
    (row,) = json.loads(run_ddptop("ls", "--json").stdout)
    assert row["state"] == ("running" if supervisor == "live" else "failed")
    assert row["goodput"]["productive_s"] == 40.0 and row["goodput"]["startup_s"] == 2.0, row["goodput"]
    if supervisor == "live":  # so far: the time since the last step is not yet lost
        assert 42.0 <= row["goodput"]["wall_s"] < 60.0 and row["goodput"]["other_s"] >= 0.0
    else:  # up to its last record
        assert row["goodput"]["wall_s"] == 42.0 and row["goodput"]["goodput"] == 0.9524
    shown = run_ddptop("ls").stdout.splitlines()[1].split()[8]
    (after,) = json.loads(run_ddptop("ls", "--json").stdout)  # a running job's share falls as time passes: read on both sides
    low, high = (round(100 * r["goodput"]["goodput"]) for r in (after, row))
    assert shown.endswith("%") and low <= int(shown[:-1]) <= high, (shown, row, after)


def test_a_run_directory_used_again_is_one_run(ddptop_home, tmp_path):
    """`--run-dir R` after `rm -rf R`: the first run's link in the root now leads to the second
    run, beside the second's own link. ls lists it once, and its name finds it."""
    script = tmp_path / "job.py"
    script.write_text("")
    chosen = tmp_path / "R"
    for started in (1.0, 2.0):
        if chosen.exists():
            shutil.rmtree(chosen)
        run = rundir.create(script, chosen)
        run.write_meta({"id": run.id, "script": str(script), "nproc_per_node": 2, "started": started, "state": "finished"})
        EventLog(run.events_path).close()
    assert len(list(rundir.runs_root().iterdir())) == 2  # both links are there
    listed = json.loads(run_ddptop("ls", "--json").stdout)
    assert [(r["id"], r["started"]) for r in listed] == [("R", 2.0)]
    assert rundir.find("R").path == chosen


def _fake_run(tmp_path, state: str, supervisor_pid: int) -> rundir.RunDir:
    script = tmp_path / "job.py"
    script.write_text("")
    run = rundir.create(script, None)
    run.write_meta(
        {
            "id": run.id,
            "script": str(script),
            "nproc_per_node": 2,
            "started": 1.0,
            "state": state,
            "supervisor_pid": supervisor_pid,
            "supervisor_started": None,
        }
    )
    EventLog(run.events_path).close()
    return run


def test_attach_to_nothing_or_to_a_missing_run(ddptop_home):
    assert_one_line_error(run_ddptop("attach"), "no running job of yours")
    assert_one_line_error(run_ddptop("attach", "nope"), "no run matches")


def test_attach_to_a_finished_run_points_to_replay(ddptop_home, tmp_path):
    run = _fake_run(tmp_path, "finished", os.getpid())
    assert_one_line_error(run_ddptop("attach", run.id), f"ddptop replay {run.id}")


def test_attach_to_a_dead_socket_file(ddptop_home, tmp_path):
    run = _fake_run(tmp_path, "running", os.getpid())  # a live pid, but nobody listens
    bound_unix(run.socket_path).close()
    assert_one_line_error(run_ddptop("attach", run.id), "does not answer on its socket")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a socket another user's needs root")
def test_attach_to_another_users_socket(ddptop_home, tmp_path):
    run = _fake_run(tmp_path, "running", os.getpid())
    sock = bound_unix(run.socket_path)
    os.chown(run.socket_path, 65534, 65534)
    try:
        assert_one_line_error(run_ddptop("attach", run.id), "belongs to another user")
    finally:
        sock.close()


def test_operating_a_run_that_cannot_be_operated_is_one_line_and_exit_2(ddptop_home, tmp_path):
    """stop, restart and kill find their run alike (control.live_run): each case once, by one of them."""
    assert_one_line_error(run_ddptop("stop"), "no running job of yours to stop")
    assert_one_line_error(run_ddptop("kill", "nope", "--rank", "0"), "no run matches")
    ended = _fake_run(tmp_path, "finished", os.getpid())
    assert_one_line_error(run_ddptop("restart", ended.id), f"run {ended.id} has finished: nothing to restart")
    stale = _fake_run(tmp_path, "running", os.getpid())  # its supervisor died: the socket file stayed
    bound_unix(stale.socket_path).close()
    assert_one_line_error(run_ddptop("stop", stale.id), "does not answer on its socket")


def test_logs_of_a_run_without_logs_and_of_an_attempt_it_never_had(ddptop_home, tmp_path):
    run = _fake_run(tmp_path, "finished", os.getpid())
    assert_one_line_error(run_ddptop("logs", run.id), "has no rank logs")
    log = run.logs_path / "abc_0" / "attempt_0" / "1" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_text("hello\n\r 50%|#\r100%|##\nworld\n\r 10%|", newline="")
    said = run_ddptop("logs", run.id).stdout
    assert said == "[rank1] hello\n[rank1] 100%|##\n[rank1] world\n[rank1]  10%|\n", (
        "a bar as a terminal leaves it, and a line not ended yet"
    )
    log.write_text("hello\nworld\n")
    assert run_ddptop("logs", run.id, "--rank", "1").stdout == "hello\nworld\n"
    assert_one_line_error(run_ddptop("logs", run.id, "--attempt", "3"), "has no attempt 3 (attempts: 0)")
    log.write_text("")
    quiet = run_ddptop("logs", run.id, "--rank", "1")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "ddptop: rank 1 wrote nothing in attempt 0\n"), "said, not silent"


def test_replay_of_a_missing_run(ddptop_home):
    assert_one_line_error(run_ddptop("replay", "nope"), "no run matches")


@pytest.fixture
def taken_port():
    """A port something else listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--listen", "127.0.0.1:{port}"], "cannot listen on 127.0.0.1:{port} for the wire (--listen): Address already in use"),
        (["--listen", "203.0.113.9:0"], "cannot listen on 203.0.113.9:0 for the wire (--listen): Cannot assign requested address"),
        (["--listen", "nope"], "--listen 'nope' is not [ADDR:]PORT"),
        (["--prometheus", "{port}"], "cannot listen on 127.0.0.1:{port} for Prometheus"),
        (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"], "--nnodes 2 needs --node-rank"),
        (["--nnodes", "2", "--node-rank", "0"], "--nnodes 2 needs --rdzv-endpoint"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"], "--node-rank 2 is outside --nnodes 2"),
        (["--nnodes", "x", "--node-rank", "0"], "--nnodes 'x' is not N or MIN:MAX"),
        # The rendezvous endpoint is not this machine's: node 0 cannot serve the other nodes there.
        (
            ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "203.0.113.9:29500"],
            "cannot listen on 203.0.113.9:29501 for the job's other nodes",
        ),
        (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:1"], "node 1 needs the job's token"),
        # A host mistyped: torchrun would retry its name for many minutes, one node or several.
        (["--rdzv-endpoint", "no-such-host.invalid:29400"], "--rdzv-endpoint: cannot resolve 'no-such-host.invalid'"),
        (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "no-such-host.invalid"], "--rdzv-endpoint: cannot resolve"),
    ],
)
def test_bad_tcp_and_multinode_input_is_one_line_and_starts_nothing(ddptop_home, taken_port, args, fragment):
    args = [a.format(port=taken_port) for a in args]
    result = run_ddptop("launch", *args, str(EXAMPLE), "--gpus", "1", env={"DDPTOP_TOKEN": ""})
    assert_one_line_error(result, fragment.format(port=taken_port))
    assert not (ddptop_home / "runs").exists() or not any((ddptop_home / "runs").iterdir())


@pytest.mark.slow  # waits out the rendezvous' own timeout
def test_a_node_whose_rendezvous_nobody_serves_gives_up_in_one_line(ddptop_home, taken_port):
    result = run_ddptop(
        "launch",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-endpoint",
        "127.0.0.1:9",
        "--join-timeout",
        "1",
        str(EXAMPLE),
        "--gpus",
        "1",
        env={"DDPTOP_TOKEN": "t"},
    )
    assert_one_line_error(result, "no ddptop supervisor of node 0 answered at 127.0.0.1:10 within 1 s (Connection refused)")
    assert not (ddptop_home / "runs").exists()


def test_attach_over_tcp_to_nobody_or_without_a_token(ddptop_home, taken_port):
    assert_one_line_error(run_ddptop("attach", "127.0.0.1:9"), "no supervisor answers at 127.0.0.1:9")
    assert_one_line_error(run_ddptop("attach", f"127.0.0.1:{taken_port}", env={"DDPTOP_TOKEN": ""}), "needs the run's token")


def test_a_ranks_log_tail_ends_with_the_stream_it_wrote_last(tmp_path):
    """A rank's stderr gets warnings at its start and its stdout the steps after: the tail a
    dashboard shows the end of must end with the steps, and follow them."""
    folder = tmp_path / "logs" / "job_x" / "attempt_0" / "0"
    folder.mkdir(parents=True)
    (folder / "stderr.log").write_text("UserWarning: early\n")
    os.utime(folder / "stderr.log", (1, 1))
    (folder / "stdout.log").write_text("".join(f"step {n}\n" for n in range(0, 5300, 100)))
    tail = rundir.rank_log_tail(tmp_path, 0, 0, 3)
    assert tail == ["[stderr] UserWarning: early", "[stdout] step 5000", "[stdout] step 5100", "[stdout] step 5200"]


def test_a_ranks_log_tail_shows_a_progress_bar_as_a_terminal_leaves_it(tmp_path):
    """tqdm redraws its bar after a carriage return at each update: a tail split at every
    "\\r" is hundreds of bars that bury the script's own lines. A terminal shows each line's
    last redraw, and so does the tail, also of a bar that has run longer than the tail reads."""
    folder = tmp_path / "logs" / "job_x" / "attempt_0" / "0"
    folder.mkdir(parents=True)
    bar = "".join(f"\r{n:3d}%|{'#' * (n // 10):<10}| {n}/100" for n in range(101))
    (folder / "stdout.log").write_bytes(f"epoch 1\r\n{bar}\nval acc 0.91\n{bar[:-40]}".encode())
    assert rundir.rank_log_tail(tmp_path, 0, 0, 10, streams=("stdout",)) == [
        "epoch 1",
        "100%|##########| 100/100",
        "val acc 0.91",
        bar[:-40].rsplit("\r", 1)[-1],  # the bar running now, as far as it is written
    ]
    long_bar = "".join(f"\r{n} it" for n in range(20_000))  # over rundir.TAIL_BYTES, with no newline yet
    (folder / "stdout.log").write_bytes(f"started\n{long_bar}".encode())
    assert rundir.rank_log_tail(tmp_path, 0, 0, 10, streams=("stdout",)) == ["19999 it"]


def _stacks_answered(state: JobState, answers: list[dict]) -> tuple[int, list[dict]]:
    """`ddptop stacks` against a socket whose other end sends what a supervisor sends: the
    state's frames, then, once asked, its answers in one write, as a supervisor's ranks dumped
    at once arrive (the second was lost once). Its exit status and what it sent."""
    ours, theirs = socket.socketpair()
    heard: list[dict] = []

    def supervisor() -> None:
        decoder = FrameDecoder()
        while not heard:  # the viewer's hello
            heard.extend(decoder.feed(theirs.recv(65536)))
        theirs.sendall(b"".join(wire.encode(frame) for frame in snapshot.frames(state)))
        theirs.sendall(wire.encode(builders.build("heartbeat", rank=0, wall=2.0, phase="data", step=3)))
        while heard[-1]["type"] != "command":
            heard.extend(decoder.feed(theirs.recv(65536)))
        theirs.sendall(b"".join(map(wire.encode, answers)))

    answering = threading.Thread(target=supervisor, daemon=True)
    answering.start()
    status = stacks.dump(Connection(ours, "r"))
    answering.join(5)
    return status, heard


def _dump(rank: int) -> dict:
    return builders.build("stack", rank=rank, wall=3.0, source="py-spy --native", text=f"Thread {rank}: MainThread\n")


def test_stacks_says_at_once_which_ranks_have_exited_and_dumps_the_others(capsys):
    """`ddptop stacks` reads the job's state first, as a dashboard does: rank 1's process has
    ended (between a crash and torchrun's restart), so it is named at once and not asked for,
    rather than waited for until the command's bound."""
    state = JobState()
    for rank in (0, 1, 2):
        state.ingest(builders.hello(rank, 3))
    state.ingest(builders.build("rank_gone", rank=1, wall=1.0))
    status, heard = _stacks_answered(state, [_dump(0), _dump(2)])
    assert status == 1  # a rank had no stacks to dump
    assert heard[-1] == {"type": "command", "action": "stacks", "ranks": [0, 2], "origin": "shell"}
    out = capsys.readouterr().out
    assert out == (
        "ddptop: rank 1 has exited: no stacks to dump\n"
        "==> rank 0 (py-spy --native) <==\nThread 0: MainThread\n\n"
        "==> rank 2 (py-spy --native) <==\nThread 2: MainThread\n\n"
    ), out


def test_stacks_takes_the_supervisors_word_that_a_rank_gave_none_by_its_kind_not_its_words(capsys):
    """A rank whose stacks nobody could read is answered for by the supervisor's action of
    kind NO_STACKS, whatever its words say: `ddptop stacks` prints them as that rank's answer,
    rather than waiting out its bound for a dump that will not come and saying it had none."""
    state = JobState()
    for rank in (0, 1):
        state.ingest(builders.hello(rank, 2))
    none = wire.validate({"type": "action", "wall": 3.0, "rank": 1, "text": "rank 1: py-spy could not read it", "kind": records.NO_STACKS})
    status, _ = _stacks_answered(state, [_dump(0), none])
    assert status == 1
    assert capsys.readouterr().out == "==> rank 0 (py-spy --native) <==\nThread 0: MainThread\n\nddptop: rank 1: py-spy could not read it\n"
