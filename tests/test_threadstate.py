"""threadstate: what gloo's C++ threads need from Python."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import weakref
from collections.abc import Callable

import torch

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


def test_keep_past_exit_takes_a_reference_it_never_gives_back():
    tensor = torch.ones(3)
    before = sys.getrefcount(tensor)
    threadstate.keep_past_exit([tensor])
    assert sys.getrefcount(tensor) == before + 1


class Callback:
    """Stands for a comm hook's callback: weak-referenceable, held by another thread."""


def test_wait_for_release_returns_once_another_thread_drops_the_objects_or_at_the_timeout():
    held = [Callback()]
    waiting = [weakref.ref(held[0])]
    go = threading.Event()

    def holder(objects: list[Callback]) -> None:
        go.wait()
        objects.clear()

    thread = threading.Thread(target=holder, args=(held,))
    thread.start()
    started = time.monotonic()
    threadstate.wait_for_release(waiting, 0.05)
    assert waiting[0]() is not None and time.monotonic() - started >= 0.05
    go.set()
    threadstate.wait_for_release(waiting, 30.0)
    assert waiting[0]() is None
    thread.join()
