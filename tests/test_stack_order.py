"""Stack dumps as users read them: the main thread first, ddptop's own threads last and marked."""

from __future__ import annotations

import subprocess
import sys

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
