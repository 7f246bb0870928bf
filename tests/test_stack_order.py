"""Stack dumps as users read them: the main thread first, ddptop's own threads last and marked;
a stopped rank's stack, or why there is none."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from ddptop.supervisor.watching import stacks
from ddptop.supervisor.watching.stacks import OWN_MARK, script_first
from ddptop.trainer import sender

DUMPER = """
import faulthandler, threading
from ddptop.trainer.sender import Sender
done = threading.Event()
threading.Thread(target=done.wait, name="loader").start()
Sender("unix:/nonexistent", {"type": "rank_hello", "world_size": 1}, lambda: {"type": "heartbeat"}).start()
def train_step():
    faulthandler.dump_traceback(all_threads=True)
train_step()
done.set()
"""


def test_a_real_faulthandler_dump_puts_the_script_first_and_marks_the_sender():
    dumped = subprocess.run([sys.executable, "-c", DUMPER], capture_output=True, text=True, timeout=60, check=True).stderr
    assert dumped.index("in train_step") > dumped.index("sender.py")  # faulthandler lists the current thread last
    ordered = script_first(dumped)
    blocks = ordered.split("\n\n")
    assert blocks[0].startswith("Current thread") and "in train_step" in blocks[0]
    assert "sender.py" in blocks[-1] and blocks[-1].splitlines()[0].endswith(OWN_MARK)
    assert len(blocks) == 3 and OWN_MARK not in blocks[1]


def test_py_spy_s_thread_names_and_native_threads():
    dump = "\n".join(
        [
            "Process 42: python train.py",
            "Python v3.11.7 (/usr/bin/python3.11)",
            "",
            'Thread 43 (idle): "ddptop-sender"',
            f"    _run ({sender.__file__}:112)",
            "",
            "Thread 44 (idle)",
            "    <no Python frame>",
            "",
            'Thread 42 (idle): "MainThread"',
            "    batches (data.py:43)",
            "    <module> (train.py:60)",
        ]
    )
    ordered = script_first(dump).splitlines()
    assert ordered[:3] == ["Process 42: python train.py", "Python v3.11.7 (/usr/bin/python3.11)", ""]
    assert ordered[3] == 'Thread 42 (idle): "MainThread"' and ordered[7] == 'Thread 43 (idle): "ddptop-sender"' + OWN_MARK
    assert ordered[-1] == "(1 thread in no Python code left out)"


def test_a_forked_rank_s_dump_leaves_out_the_template_below_its_script():
    """A rank forked from the template shows the stack a rank torchrun started would."""
    faulthandler_dump = "\n".join(
        [
            "Current thread 0x00007f (most recent call first):",
            '  File "/work/exp/train.py", line 43 in batches',
            '  File "/work/exp/train.py", line 60 in <module>',
            '  File "/venv/lib/python3.11/site-packages/ddptop/trainer/template/child.py", line 62 in run',
            '  File "/venv/lib/python3.11/site-packages/ddptop/trainer/template/server.py", line 44 in main',
            '  File "<string>", line 1 in <module>',
        ]
    )
    assert script_first(faulthandler_dump).splitlines()[-1] == '  File "/work/exp/train.py", line 60 in <module>'
    py_spy_dump = "\n".join(
        [
            'Thread 42 (idle): "MainThread"',
            "    <module> (train.py:280)",
            "    run (trainer/template/child.py:62)",
            "    main (trainer/template/server.py:55)",
            "    <module> (<string>:1)",
        ]
    )
    assert script_first(py_spy_dump).splitlines() == ['Thread 42 (idle): "MainThread"', "    <module> (train.py:280)"]
    plain = '  File "<string>", line 1 in <module>'  # a `python -c` script's own frame stays
    assert script_first(f"Current thread 0x1 (most recent call first):\n{plain}").splitlines()[-1] == plain


def test_the_training_thread_inside_ddptops_hooks_is_still_the_main_thread():
    """A rank stuck in an all-reduce runs through ddptop's backward wrapper: what
    started the thread says whose it is, not what it runs now."""
    dump = "\n".join(
        [
            "Thread 0x00007f01 (most recent call first):",
            f'  File "{sender.__file__}", line 112 in _run',
            '  File "/usr/lib/python3.11/threading.py", line 982 in run',
            '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap',
            "",
            "Current thread 0x00007f00 (most recent call first):",
            '  File "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 347 in backward',
            f'  File "{hooks_file()}", line 236 in backward',
            '  File "/work/exp/train.py", line 51 in train',
            '  File "/work/exp/train.py", line 60 in <module>',
        ]
    )
    blocks = script_first(dump).split("\n\n")
    assert blocks[0].startswith("Current thread") and OWN_MARK not in blocks[0]
    assert blocks[1].startswith("Thread 0x00007f01") and blocks[1].splitlines()[0].endswith(OWN_MARK)


def hooks_file() -> str:
    """ddptop's hooks module, found without importing it (it imports torch)."""
    spec = importlib.util.find_spec("ddptop.trainer.hooks")
    assert spec is not None and spec.origin is not None
    return spec.origin


def test_py_spy_s_native_frames_do_not_hide_whose_thread_it_is_or_the_template():
    dump = "\n".join(
        [
            'Thread 43 (idle): "ddptop-sender"',
            "    0x7f25182a3f16 (libc.so.6)",
            "    Sender._run (trainer/sender.py:112)",
            "    Thread._bootstrap (threading.py:1002)",
            "    0x7f25183278ec (libc.so.6)",
            "",
            'Thread 42 (idle): "MainThread"',
            "    clock_nanosleep (libc.so.6)",
            "    <module> (train.py:280)",
            "    run (trainer/template/child.py:62)",
            "    <module> (<string>:1)",
            "    0x7f251824524a (libc.so.6)",
        ]
    )
    assert script_first(dump).splitlines() == [
        'Thread 42 (idle): "MainThread"',
        "    clock_nanosleep (libc.so.6)",
        "    <module> (train.py:280)",
        "",
        'Thread 43 (idle): "ddptop-sender"' + OWN_MARK,
        "    0x7f25182a3f16 (libc.so.6)",
        "    Sender._run (trainer/sender.py:112)",
        "    Thread._bootstrap (threading.py:1002)",
        "    0x7f25183278ec (libc.so.6)",
    ]


STOPPED_RANK = """
import sys, time
def train_step():
    print("ready", flush=True)
    while True:
        time.sleep(0.01)
train_step()
"""


@pytest.fixture
def stopped_rank(tmp_path: Path) -> Iterator[subprocess.Popen]:
    """A process stopped with SIGSTOP in its script's train_step, as a user's kill -STOP leaves a rank."""
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_RANK], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: stacks.process_state(proc.pid) == "T", 10, "the process to stop")
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def test_a_stopped_rank_s_stack_is_read_by_py_spy(stopped_rank, tmp_path):
    assert stacks.py_spy() is not None, "py-spy is a dependency: ./dev installs it"
    got = await stacks.dump(tmp_path, 0, stopped_rank.pid)
    assert got is not None
    source, text = got
    assert source == "py-spy --nonblocking" and "train_step (<string>:" in text, text  # stopped in its sleep or its loop


@pytest.mark.slow  # a real stopped process, read after the watchdog's wait
@pytest.mark.oldest
async def test_without_py_spy_a_stopped_rank_is_said_to_be_stopped(stopped_rank, tmp_path, monkeypatch):
    monkeypatch.setattr(stacks, "py_spy", lambda: None)
    assert await stacks.dump(tmp_path, 0, stopped_rank.pid) is None  # faulthandler's handler cannot run
    assert (
        stacks.why_none(stopped_rank.pid)
        == "py-spy is not installed and faulthandler got no answer (it is stopped: SIGSTOP, or a debugger holds it)"
    )
