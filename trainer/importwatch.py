"""Run a callback right after a module has been imported, without importing it.

The bootstrap must not import torch itself (a script that never uses torch
should not pay for it, and the script may set torch's environment first),
yet the hooks must be in place before the script builds its model. A finder
at the front of sys.meta_path sees the script's own `import torch`, lets the
normal finders locate it, and wraps that one loader's exec_module so the
callback runs once the module has finished initialising.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self._name = name
        self._callback = callback

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        callback = self._callback

        def exec_then_callback(module: ModuleType) -> None:
            exec_module(module)
            callback()

        # The loader object belongs to this spec alone, so patching the
        # instance touches nothing else; the module's __loader__ is unchanged.
        loader.exec_module = exec_then_callback  # type: ignore[method-assign]
        return spec


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Call callback once module `name` is imported (a submodule's package must be); now if it is."""
    if name in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
