"""threadstate.keep() on a thread Python did not start, as gloo's workers are."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from ddptop.trainer import threadstate

_api = ctypes.pythonapi
_api.PyInterpreterState_Get.restype = ctypes.c_void_p
_api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
_api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
_api.PyThreadState_Next.restype = ctypes.c_void_p
_api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
_START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def thread_states() -> int:
    """How many Python thread states the interpreter holds, live or kept."""
    count, state = 0, _api.PyInterpreterState_ThreadHead(_api.PyInterpreterState_Get())
    while state:
        count, state = count + 1, _api.PyThreadState_Next(state)
    return count


def on_a_native_thread(call: Callable[[], None]) -> None:
    """Run call from a pthread that Python does not know, entering Python as a
    C++ callback does: a thread state made for the call, dropped after it."""
    start = _START(lambda arg: call())
    libc = ctypes.CDLL(None)
    thread = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(thread), None, start, None) == 0
    assert libc.pthread_join(thread, None) == 0


def test_a_native_thread_that_called_keep_keeps_its_thread_state():
    before = thread_states()
    on_a_native_thread(lambda: None)
    assert thread_states() == before, "a plain callback's thread state is dropped after it"
    on_a_native_thread(threadstate.keep)
    assert thread_states() == before + 1


def test_keep_takes_no_count_on_the_main_thread_and_then_costs_a_lookup():
    before = thread_states()
    threadstate.keep()
    threadstate.keep()
    assert thread_states() == before
