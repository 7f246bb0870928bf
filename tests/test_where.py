"""Where a rank's main thread is, as the heartbeat's WHERE names it, and the frame a crash verdict names."""

from __future__ import annotations

import threading

from ddptop.core.places import is_script
from ddptop.trainer import hooks
from ddptop.trainer.where import where


def test_where_names_the_main_thread_s_innermost_line_of_the_script_s_own_code():
    """Asked from another thread (as the sender asks), past the standard library's frames (join)."""
    seen: list[str] = []
    asker = threading.Thread(target=lambda: seen.append(where()))

    def waiting_here() -> None:
        asker.start()
        asker.join()

    waiting_here()
    assert seen[0].startswith("test_where.py:") and seen[0].endswith(" in waiting_here"), seen


def test_ddptop_s_own_frames_are_not_the_script_s_wherever_it_is_installed():
    assert not is_script(hooks.__file__)  # an editable install puts it in this checkout, outside any site-packages
    assert not is_script("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py")
    assert not is_script("/usr/lib/python3.11/threading.py") and not is_script("<frozen importlib._bootstrap>")
    assert is_script("/home/u/ddptop/examples/train.py")  # a user's folder may be named like the tool
