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
"""

from __future__ import annotations

import ctypes
import threading

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
