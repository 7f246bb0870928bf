"""Every change ddptop makes to torch inside a rank, recorded in one place with its undo.

A rank's torch is instrumented by replacing a few of its callables (hooks.py)
and registering global optimizer hooks. Each goes through `replace` or
`registered` here, so `applied()` lists them all (README, "What ddptop
changes in torch") and `undo()` puts torch back as it was, in reverse
order: the tests undo after each test, a rank never needs to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

_ABSENT = object()


class Handle(Protocol):
    def remove(self) -> None: ...


_applied: list[tuple[str, Callable[[], None]]] = []


def replace(owner: Any, name: str, new: Any) -> Any:
    """Put new in owner.name; return what was there (inherited or the owner's own)."""
    original = getattr(owner, name)
    own = vars(owner).get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, new)

    def undo() -> None:
        if own is _ABSENT:
            delattr(owner, name)  # it was inherited: let the base's show again
        else:
            setattr(owner, name, own)

    where = f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type) else getattr(owner, "__name__", repr(owner))
    _applied.append((f"{where}.{name}", undo))
    return original


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
