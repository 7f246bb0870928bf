"""importwatch: callbacks once a module is imported, without importing it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddptop.trainer import importwatch


@pytest.fixture
def module_on_path(tmp_path: Path) -> Iterator[str]:
    """A module no one has imported yet, on sys.path; forgotten afterwards."""
    name = "ddptop_watched_module"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    yield name
    sys.path.remove(str(tmp_path))
    sys.modules.pop(name, None)


def test_every_callback_for_one_module_runs_once_it_has_initialised_in_the_order_asked(module_on_path):
    """Two parts of ddptop wait for torch.distributed.fsdp (FSDP2's fully_shard, FSDP1's class),
    each with a finder of its own on sys.meta_path: both must see the one import."""
    seen: list[tuple[str, int]] = []
    for tag in ("first", "second"):
        importwatch.after_import(module_on_path, lambda tag=tag: seen.append((tag, sys.modules[module_on_path].VALUE)))
    assert seen == []
    __import__(module_on_path)
    assert seen == [("first", 1), ("second", 1)]
    importwatch.after_import(module_on_path, lambda: seen.append(("imported", 1)))
    assert seen[-1] == ("imported", 1), "a module already imported: at once"
