"""Where in the script's own code: a rank's live place and a crash's frame are both named this way.

A stack runs through torch, the standard library and ddptop as well as the
script; the user needs the innermost line of their own code, not the line
in torch where it surfaced. Only the standard library is imported here: the
trainer uses it inside every rank.
"""

from __future__ import annotations

import functools
import importlib.util
import os

NOT_THE_SCRIPT = ("/site-packages/", "/dist-packages/", "/lib/python3")
"""Path parts of installed packages and the standard library (on this machine or a rank's)."""

OWN_PACKAGES = ("ddptop", "ddptop.core", "ddptop.trainer", "ddptop.supervisor", "ddptop.tui")


@functools.cache
def _own_folders() -> tuple[str, ...]:
    """Where ddptop's own code is: its packages' folders, wherever an install (editable too) put them.

    Found, not imported: the packages' code does not run for this.
    """
    folders: list[str] = []
    for name in OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            folders += [os.path.join(folder, "") for folder in spec.submodule_search_locations]
    return tuple(folders)


@functools.lru_cache(maxsize=4096)
def is_script(path: str) -> bool:
    """Whether a frame's file is the user's own code.

    Cached: a heartbeat asks it of every frame of the main thread's stack,
    and a process runs code from a few hundred files at most."""
    return not path.startswith("<") and not any(part in path for part in NOT_THE_SCRIPT) and not is_ddptop(path)


TEMPLATE_FILES = ("trainer/template/server.py", "trainer/template/child.py")
"""The frames below the script's in a rank forked from ddptop's template (the fork's caller):
not the rank's own, and not in a stack shown as the rank's."""


def is_template(path: str) -> bool:
    return path.endswith(TEMPLATE_FILES)


def is_ddptop(path: str) -> bool:
    """Whether a frame's file is ddptop's own code."""
    return path.startswith(_own_folders())


def place(path: str, line: int | str, function: str) -> str:
    """ "train.py:89 in <module>": the file's name, not its folder, as an editor's jump list shows it."""
    return f"{path.rsplit('/', 1)[-1]}:{line} in {function}"


def stack_line(path: str, line: int | str, function: str) -> str:
    """One frame of a stack as a heartbeat sends it: the script's by file name alone, as
    place() names them; an installed file's from its package down ("torch/nn/modules/module.py:1750
    in _call_impl"), the standard library's from its version folder ("python3.11/threading.py:320
    in wait"); so a line whose file has no folder, and is no "<frozen ...>", is the script's."""
    if is_script(path):
        return place(path, line, function)
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return f"{path.rsplit(marker, 1)[1]}:{line} in {function}"
    return f"{'/'.join(path.rsplit('/', 2)[-2:])}:{line} in {function}"


def is_script_line(text: str) -> bool:
    """Whether a stack_line() is a frame of the script's own code."""
    return "/" not in text.split(":", 1)[0] and not text.startswith("<")
