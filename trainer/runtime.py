"""Turning ddptop on inside one rank: identity, sender, hooks, exit handling.

Called by the bootstrap (sitecustomize) when the process is a rank started
by torchrun under a ddptop supervisor. Everything here is cheap and starts
no work on the training thread; the torch hooks wait for the script's own
`import torch`.
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from types import TracebackType

from ddptop.core import launch_env, wire
from ddptop.core.policy import STACK_SIGNAL, GuardPolicy
from ddptop.trainer import flightrecorder, importwatch, monitor, where
from ddptop.trainer.procstat import stat_fields
from ddptop.trainer.profiling import Captures
from ddptop.trainer.sampled import Sampled
from ddptop.trainer.sender import Sender
from ddptop.trainer.steps import StepTracker

EXIT_FLUSH_S = 1.0
TRACEBACK_MAX = 8192
"""Characters of an uncaught exception's traceback sent along (traceback_text says which)."""
MESSAGE_MAX = 2048
"""Of those, the most the exception's own message keeps (its start) when it is longer."""


def rank_hello(given: tuple[int, int] | None = None) -> wire.Frame:
    """This rank's identity: from the variables torchrun sets, or as given
    (rank, world size) by the init_process_group call of a rank that a
    script started itself (trainer/spawned.py), on one node."""
    env = os.environ
    rank, world = (int(env["RANK"]), int(env.get("WORLD_SIZE", "1"))) if given is None else given
    return {
        "type": "rank_hello",
        "rank": rank,
        "local_rank": int(env.get("LOCAL_RANK", "0")) if given is None else rank,
        "world_size": world,
        "node": int(env.get("GROUP_RANK", "0")),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "restart": monitor.attempt(),
        **({} if (started := started_wall()) is None else {"started": started}),
    }


def started_wall() -> float | None:
    """When this process started (for a rank forked from the template, the fork), as a
    Unix time to the kernel's clock tick: the first mark of a rank's start-up."""
    fields = stat_fields(22)  # starttime, in clock ticks since boot
    if fields is None:
        return None
    try:
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - fields[0] / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    return time.time() - age


def die_with_parent(parent_env: str | None = launch_env.AGENT_PID) -> None:
    """Ask the kernel to kill this rank when torchrun dies (no orphans).

    torchrun starts each worker in a session of its own, so a kill of
    torchrun's process group never reaches the ranks; the parent-death
    signal does, whatever killed torchrun. torchrun may already be gone
    when this runs (the signal is then never sent): its probe left its pid
    in the environment, and a rank whose parent is no longer that pid ends
    itself. ddptop's torchrun starts every rank itself, so the parent is
    torchrun for as long as torchrun lives.
    """
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    parent = None if parent_env is None else os.environ.get(parent_env)
    if parent is not None and os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGKILL)


def stacks_on_signal(rank: int) -> None:
    """Write every thread's Python stack to the run directory on STACK_SIGNAL.

    faulthandler does it from C inside the signal handler, so it works while
    the main thread is stuck in a collective or a sleep, which is exactly
    when the supervisor asks. Fatal signals (SIGSEGV...) get the same dump on
    stderr, which torchrun keeps in the rank's log.
    """
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    folder = os.environ.get(launch_env.STACKS_DIR)
    if folder and os.path.isdir(folder):
        stream = open(os.path.join(folder, f"rank{rank}.{os.getpid()}.txt"), "a")  # noqa: SIM115 - open for life
        faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True, chain=False)


Report = Callable[[BaseException], None]
"""Sends an exception's traceback to the supervisor (for a failure the interpreter's excepthook never sees)."""


def report_uncaught(put: Callable[[wire.Frame], None], rank: int, phase: Callable[[], str]) -> Report:
    """Send an uncaught exception's traceback to the supervisor, then print it as usual.

    So the crash alert can quote the first failing rank's own error without
    the script decorating its main with torchrun's @record, and say where in
    its step the rank raised it (phase), which its heartbeats no longer tell.
    """
    previous = sys.excepthook

    def report(value: BaseException) -> None:
        put({"type": "exception", "rank": rank, "wall": time.time(), "text": traceback_text(value), "phase": phase()})

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        report(value.with_traceback(tb))
        previous(kind, value, tb)

    sys.excepthook = hook
    return report


def traceback_text(value: BaseException) -> str:
    """value's traceback as Python prints it, in at most TRACEBACK_MAX characters: the frames
    nearest the error and the start of its message. A torch error can run to thousands of
    lines (a dispatcher's list of backends, one a line, after "Could not run ..."): its end
    alone would leave neither the frames nor the line that says what went wrong."""
    text = "".join(traceback.format_exception(type(value), value, value.__traceback__))
    if len(text) <= TRACEBACK_MAX:
        return text
    message = "".join(traceback.format_exception_only(type(value), value))
    frames = text[: len(text) - len(message)] if text.endswith(message) else ""
    if len(message) > MESSAGE_MAX:
        message = message[:MESSAGE_MAX] + "\n[... the message goes on]\n"
    return frames[-(TRACEBACK_MAX - len(message)) :] + message  # the message is at most MESSAGE_MAX and a line


def activate(given: tuple[int, int] | None = None, parent_env: str | None = launch_env.AGENT_PID) -> Report:
    """Report this process as a rank: identity from torchrun's variables or given (rank, world size)."""
    hello = rank_hello(given)
    die_with_parent(parent_env)
    stacks_on_signal(hello["rank"])
    sender: Sender
    tracker = StepTracker(hello["rank"], emit=lambda record: sender.put(record))
    last_stack: tuple[str, ...] = ()
    on_step = (tracker.step, time.monotonic())
    """The step in progress, and since when: a rank that sits on one reads the flight recorder."""

    sampled = Sampled()
    phase = where.Phase()

    def heartbeat() -> wire.Frame:
        nonlocal last_stack, on_step
        record: wire.Frame = {
            "type": "heartbeat",
            "rank": tracker.rank,
            "wall": time.time(),
            "phase": tracker.phase,
            "step": tracker.step,
            "forwards": tracker.forwards,
            "dropped": sender.dropped + tracker.dropped,
        }
        # Exiting, the main thread has left the script's code (the interpreter shuts down):
        # the last place it was in stands.
        if tracker.phase != "exit":
            now = where.sample()
            record["phase"] = phase.of(now, tracker.phase, tracker.step, tracker.eval_code)
            record["where"] = now.where
            if now.inside is not None:
                record["inside"] = now.inside
            if now.stack != last_stack:
                record["stack"] = list(now.stack)
                last_stack = now.stack
        if (uuid := sampled.gpu_uuid()) is not None:
            record["gpu_uuid"] = uuid
        if tracker.replicas is not None:
            record["replicas"] = list(tracker.replicas)
        if tracker.batch_shared > 1:
            record["batch_shared"] = tracker.batch_shared
        if tracker.step != on_step[0]:
            on_step = (tracker.step, time.monotonic())
        elif time.monotonic() - on_step[1] >= flightrecorder.READ_AFTER_S and (seq := flightrecorder.collectives()) is not None:
            record["collectives"] = seq
        return record

    captures = Captures(tracker.rank, hello["restart"], lambda record: sender.put(record))
    sender = Sender(
        os.environ[launch_env.ADDRESS], hello, heartbeat, collect=lambda: tracker.build(sampled.read()), on_command=captures.ask
    )
    report = report_uncaught(sender.put, tracker.rank, lambda: tracker.phase)
    monitor.bind(tracker)
    sender.start()

    def install_hooks() -> None:
        tracker.event({"type": "phase", "rank": tracker.rank, "wall": time.time(), "phase": "torch"})
        try:
            from ddptop.trainer import hooks

            hooks.install(tracker, GuardPolicy.from_env(), sampled, captures)
        except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
            print(f"ddptop: rank {tracker.rank}: instrumentation off: {exc}", file=sys.stderr)

    importwatch.after_import("torch", install_hooks)

    def at_exit() -> None:
        tracker.phase = "exit"
        captures.abort("the rank exited")
        tracker.flush(sampled.read(now=True))
        sender.close(EXIT_FLUSH_S)

    atexit.register(at_exit)
    return report
