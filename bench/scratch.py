"""Scratch folders for a bench's runs: their sockets, run directories and checkpoints.

A bench makes them under the system's temporary folder and nobody reads
them afterwards, so each is removed when the bench's process exits; left
behind, every run would add its own (run directories hold whole event logs).
A bench's runs are listed in a ddptop home of its own (scratch_home), not
among the user's, where they would stay as entries of folders long gone.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def scratch_folder(prefix: str) -> str:
    """A new folder, removed with everything in it when this process exits."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def scratch_home() -> None:
    """A scratch folder as this process's ddptop home (DDPTOP_HOME), which the runs it starts inherit."""
    os.environ["DDPTOP_HOME"] = scratch_folder("ddptop-bench-home-")
