"""Scratch folders for a bench's runs: their sockets, run directories and checkpoints.

A bench makes them under the system's temporary folder and nobody reads
them afterwards, so each is removed when the bench's process exits; left
behind, every run would add its own (run directories hold whole event logs).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile


def scratch_folder(prefix: str) -> str:
    """A new folder, removed with everything in it when this process exits."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, True)
    return folder
