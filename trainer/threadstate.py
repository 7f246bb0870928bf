"""A lasting Python thread state on the C++ threads that call back into ddptop.

gloo completes a bucket's all-reduce on one of its own C++ threads, and that
thread runs the comm hook's Python callback (hooks.py). torch enters Python
there through pybind11's gil_scoped_acquire, which, on a thread that has no
Python thread state, creates one and destroys it again as the callback
returns. That churn was most of what a Python comm hook cost over DDP's C++
one: about 50 of 70 µs a bucket on the 2-core test VM (example model, world
size 1, loss.backward() alone, each hook alternating with the others).

pybind11 keeps a thread state while its count stays above zero (the "reference
count of an acquired thread state" in pybind11/gil.h). One PyGILState_Ensure
that is never released holds it at one, once per thread, the way torch's
autograd engine keeps a thread state on its own device threads
(PythonEngine::thread_init). Python's own threads need no help: their state
lives as long as they do.

The same threads can also free Python objects too late: a bucket's
all-reduce completes on a gloo thread, which then drops the callback and,
a moment later, its reference to the bucket tensor. Both take the GIL, and
if the rank's main thread has meanwhile finished its script and the
interpreter is finalizing, taking it ends the thread; the unwinding aborts
the process ("terminate called without an active exception"). On the
2-core test VM that was about one rank exit in 80 with ddptop's comm hook
on gloo (two core dumps read in gdb, one for each path). So at exit a rank
waits for gloo to drop the callbacks (wait_for_release) and keeps the
tensors past it (keep_past_exit).

Freeing a DDP model has the same race, and ends in a deadlock: its
process group's destructor joins gloo's threads with the GIL held, while
one of them waits for the GIL to drop a callback. On the 2-core VM about
one run in six hung so as a script's main() returned (gdb: the main thread
in ~ProcessGroupGloo joining pt_gloo_runloop, which waits in take_gil to
drop a callback, or the thread-local state of a finished work). So each DDP
model waits for the callbacks' release as it is freed, and its process group
is kept to the rank's end and past it (hooks.py): the threads are never
joined, and end with the process.
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

RELEASE_POLL_S = 0.001

_state = threading.local()
"""Lives in the thread state itself: a thread state made for one call has
no `kept` yet, however the OS numbered its thread."""


def keep() -> None:
    """Give the calling thread a Python thread state for as long as it lives.

    Called from a callback, so the GIL is held and the thread state exists;
    the count that keeps it is taken once per thread. Costs an attribute
    lookup on every later call.
    """
    if getattr(_state, "kept", False):
        return
    _state.kept = True
    if threading.get_ident() != threading.main_thread().ident:
        ctypes.pythonapi.PyGILState_Ensure()


def wait_for_release(refs: Iterable[weakref.ref[Any]], timeout: float) -> None:
    """Wait, with the GIL let go, until other threads have dropped the objects refs point to.

    A gloo thread that wants the GIL to drop a callback gets it while this
    sleeps; a collective that never completes keeps its callback, and the
    wait ends at the timeout. refs may grow meanwhile (a deque the training
    thread appends to): each look copies it first.
    """
    deadline = time.monotonic() + timeout
    while any(ref() is not None for ref in list(refs)) and time.monotonic() < deadline:
        time.sleep(RELEASE_POLL_S)


def keep_past_exit(tensors: Iterable[object]) -> None:
    """Let tensors that gloo's work may still hold outlive the interpreter.

    Called at exit (atexit, before the interpreter finalizes): a Python
    reference that is never given back keeps each tensor alive, so gloo's
    late release is only a count going down. The process is exiting:
    nothing is lost by not freeing them.
    """
    for tensor in tensors:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(tensor))
