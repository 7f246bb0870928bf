"""A sharded job's collectives, timed on one step about once a second: its comm per mesh
dimension, and the wait in them that is no part of the rank's own work.

FSDP2, HSDP and FSDP1 meet in all-gathers and reduce-scatters, and HSDP's replicas in
all-reduces, that DDP's reducer never times (sampled.py). torch's flight recorder lists
them, but on gloo with no duration, and one read of it holds the GIL for about 25 ms at ddptop's
2,000 entries (docs/benchmarks.md, bench/flight_recorder.py): the training thread would
wait through every read. So the training thread, at the end of a step that sampled.py
picked, swaps torch.distributed's collective functions (COLLECTIVES) for timing ones, and
swaps them back at the end of the next step. Only that step's collectives pass through
ddptop; every other step calls torch's own functions with nothing between.

Each collective is labelled with its process group's mesh dimension (timed_collectives.label:
HSDP's "replicate" and "shard", "world" for a 1-D mesh over the whole job). On gloo a
collective called without async_op returns once every rank has entered it and its data moved: its time is the rank's wait in it, so the rank's own work
that step is the step less its data wait and that wait (steps.py, compute_ms). One called
with async_op is timed until its future completes, which gloo marks on its own thread; the
rank waits for it later, where FSDP does, so it adds to the comm time and not the wait.

A collective on CUDA tensors returns once it is queued on a stream: what a host clock
reads of it is not its time, so it is timed on the device instead (collective_spans.py),
and the step's comm is read late, once the GPU has run it. Tensor parallelism's
collectives go by DTensor's functional collectives, which never pass by these functions:
theirs stand in beside them (functional_timing.py). None is timed in code that
torch.compile traces while they are armed (timed_collectives.tracing).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ddptop.trainer import functional_timing
from ddptop.trainer.collective_spans import DeviceComm, DeviceEvents
from ddptop.trainer.step_comm import StepComm
from ddptop.trainer.timed_collectives import Collective, StepLog, Timed, label, tracing

COLLECTIVES = {
    "all_gather_single": Collective("all-gather", 2),
    "all_gather_into_tensor": Collective("all-gather", 2),
    "all_gather": Collective("all-gather", 2),
    "reduce_scatter_single": Collective("reduce-scatter", 3),
    "reduce_scatter_tensor": Collective("reduce-scatter", 3),
    "reduce_scatter": Collective("reduce-scatter", 3),
    "all_reduce": Collective("all-reduce", 2),
    "all_to_all_single": Collective("all-to-all", 4),
    "all_to_all": Collective("all-to-all", 2),
}
"""FSDP2's all-gathers (all_gather_single in a recent torch, all_gather_into_tensor in an
older one), its reduce-scatters likewise, and HSDP's all-reduce across replicas; FSDP1's go
by the older names, and on the CPU by the ones of a list of tensors. The all-to-alls are
those of a mixture of experts' expert parallelism, which sends each token to its expert's
rank. Those a torch lacks are left out."""


@dataclass(eq=False)
class Swap:
    """A function of a torch module that a timing one stands in for while armed."""

    module: str
    name: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    """The timing function for torch's own."""
    calls: str | None = None
    """Left as it is where the module has this function, which it calls (Collective.calls)."""
    timing: Callable[..., Any] | None = None
    """Made at the first arm() and put in again at each one after, for as long as torch's
    function is the same: making one is the most of what arming would cost."""


class CollectiveTimer:
    """Arms the timing functions for one step and disarms them, on the training thread."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, events: DeviceEvents | None = None) -> None:
        """clock times a collective on the host; events, on a GPU (collective_spans.py)."""
        self._clock = clock
        self._events = events or DeviceEvents()
        self._log = StepLog()
        """What the timing functions took since arm()."""
        self._saved: list[tuple[Swap, ModuleType, Any]] = []
        """Each swap made, its module and torch's own function, until disarm()."""
        self._swaps: list[Swap] = []

    @property
    def armed(self) -> bool:
        return bool(self._saved)

    def arm(self) -> None:
        """The timing functions stand in for torch's until disarm()."""
        modules = sys.modules
        if "torch.distributed" not in modules or self._saved:
            return
        self._log = StepLog()
        for swap in self._swaps or self._made_swaps():
            module = modules.get(swap.module)
            original = getattr(module, swap.name, None)
            if module is None or original is None or (swap.calls is not None and hasattr(module, swap.calls)):
                continue
            timing = swap.timing
            if timing is None or getattr(timing, "__wrapped__", None) is not original:
                timing = swap.timing = swap.make(original)
            setattr(module, swap.name, timing)
            self._saved.append((swap, module, original))

    def disarm(self) -> StepComm | DeviceComm:
        """torch's own functions back (each that nobody replaced since), and what the step's
        collectives took: read late (a DeviceComm) where some ran on a GPU; nothing unarmed."""
        if not self._saved:
            return StepComm()
        for swap, module, original in self._saved:
            if getattr(module, swap.name, None) is swap.timing:
                setattr(module, swap.name, original)
        self._saved = []
        return self._log.settle(self._events)

    def _made_swaps(self) -> list[Swap]:
        """Every function a timing one stands in for: torch.distributed's, and DTensor's
        functional collectives, their wait and its all-to-all where the script has imported
        them."""
        clock, events, traced, step = self._clock, self._events, tracing(), self._current
        functional = functional_timing.MODULE
        self._swaps = [
            *(Swap("torch.distributed", name, functools.partial(self._timing_of, collective=c)) for name, c in COLLECTIVES.items()),
            *(
                Swap(
                    functional,
                    name,
                    functools.partial(functional_timing.launching, collective=c, step=step, clock=clock, events=events, traced=traced),
                    c.calls,
                )
                for name, c in functional_timing.FUNCTIONAL.items()
            ),
            Swap(
                functional,
                functional_timing.WAIT,
                functools.partial(functional_timing.waiting, step=step, clock=clock, events=events, traced=traced),
            ),
            *(
                Swap(
                    module,
                    functional_timing.RESHARD,
                    functools.partial(functional_timing.resharding, step=step, events=events, traced=traced),
                )
                for module in functional_timing.RESHARD_MODULES
            ),
        ]
        return self._swaps

    def _current(self) -> StepLog:
        return self._log

    def _timing_of(self, original: Callable[..., Any], collective: Collective) -> Callable[..., Any]:
        timer, clock, events, traced = self, self._clock, self._events, tracing()

        @functools.wraps(original)  # torch's name, docstring and signature, for whoever looks at it
        def timing(*args: Any, **kwargs: Any) -> Any:
            if traced():  # before anything else of ddptop's: dynamo traces all it reaches here
                return original(*args, **kwargs)
            log = timer._log  # the step's log as it is called: an async one's completion may come after disarm()
            if log.full():
                return original(*args, **kwargs)
            name = label(collective.group_of(args, kwargs))
            # Where it runs: its first tensor, or the first of its first list of them (inline: this
            # runs for every collective of the timed step, on the training thread).
            tensor: Any = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(tensor, (list, tuple)):
                tensor = tensor[0] if tensor else None
            if getattr(tensor, "is_cuda", False):
                return log.bracketed(events, tensor.get_device(), name, collective.op, original, args, kwargs, returns_work=True)
            timed = log.timed
            began = clock()
            work = original(*args, **kwargs)
            took = clock() - began
            if work is None:
                timed.append(Timed(name, collective.op, took * 1e3, True))
            else:
                _time_async(work, lambda: timed.append(Timed(name, collective.op, (clock() - began) * 1e3, False)))
            return work

        return timing


def _time_async(work: Any, done: Callable[[], None]) -> None:
    """done() once an async collective completes; nothing for a work without a future."""
    try:
        work.get_future().add_done_callback(lambda _: done())
    except Exception:  # noqa: BLE001 - a backend's or a coalescing manager's work without one: never let it reach the training thread
        return
