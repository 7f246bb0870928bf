"""Every change ddptop makes to torch inside a rank, recorded in one place with its undo.

A rank's torch is instrumented by replacing a few of its callables (hooks.py)
and registering global optimizer hooks. Each goes through `replace` or
`registered` here, so `applied()` lists them all and `undo()` puts torch
back as it was, in reverse order: the tests undo after each test, a rank
never needs to.
`suspended()` puts the replaced callables back for a while: bench/inrank.py
runs plain jobs beside an instrumented one in one process, and a class's
method serves every instance.

One change is not here, because it never outlives a step: of a sharded job,
collective_timer.py swaps torch.distributed's collective functions (and DTensor's
functional ones) for timing ones at the end of one step about once a second, and
back at the end of the next.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

_ABSENT = object()


class Handle(Protocol):
    def remove(self) -> None: ...


_applied: list[tuple[str, Callable[[], None]]] = []
_replaced: list[tuple[Any, str, Any, Any]] = []
"""(owner, name, what ddptop put there, what was there) for each replace."""


def replace(owner: Any, name: str, new: Any) -> Any:
    """Put new in owner.name; return what was there (inherited or the owner's own)."""
    original = getattr(owner, name)
    own = vars(owner).get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, new)
    entry = (owner, name, new, own)
    _replaced.append(entry)

    def undo() -> None:
        _replaced[:] = [other for other in _replaced if other is not entry]
        _put(owner, name, own)

    where = f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type) else getattr(owner, "__name__", repr(owner))
    _applied.append((f"{where}.{name}", undo))
    return original


def _put(owner: Any, name: str, value: Any) -> None:
    if value is _ABSENT:
        delattr(owner, name)  # it was inherited: let the base's show again
    else:
        setattr(owner, name, value)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """torch's own callables in place of ddptop's replacements, until the block ends
    (registered hooks stay)."""
    for owner, name, _new, own in reversed(_replaced):
        _put(owner, name, own)
    try:
        yield
    finally:
        for owner, name, new, _own in _replaced:
            setattr(owner, name, new)


def registered(what: str, handle: Handle) -> None:
    """A hook registered with torch (its handle removes it)."""
    _applied.append((what, handle.remove))


def applied() -> list[str]:
    """What is changed now, in the order it was changed."""
    return [what for what, _ in _applied]


def undo() -> None:
    """Put back everything, newest first."""
    while _applied:
        _applied.pop()[1]()
