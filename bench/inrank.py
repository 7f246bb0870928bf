"""What ddptop's hooks cost inside one rank, measured side by side in one process.

overhead.py measures whole jobs, where the supervisor, torchrun's log
threads and the machine's drift blur a few hundred microseconds: on a
shared 2-core VM one run against the next varies by 15% even in CPU time.
This runs the example job's own loop (its model, loader and optimizer) as
two identical jobs in each rank's process: one plain, built before ddptop's
hooks are installed and run with torch's own callables put back
(patches.suspended), and one instrumented, built after them. Blocks of steps
alternate between the two, so drift falls on both alike; each block's wall
and CPU time per step are kept, and the figures are rank 0's medians over
blocks. Each block starts with a few untimed steps (--warmup-steps): the
first steps after a switch run on caches the other jobs filled, which no
real run pays, and those steps cost a job the more the more code it runs
(per-step times by position in a block, on the 2-core VM: the first steps
of every job are 10-25% slower, ddptop's the most). The instrumented job's
records go out as in a rank: ddptop's Sender builds them on its own thread
every flush interval and writes them to a socket, which a thread of this
process reads and drops.

    python bench/inrank.py --width 256 --batch-size 32 --blocks 300
    python bench/inrank.py --width 8192 --batch-size 1024 --profile
    python bench/inrank.py --without guard   # what the rest costs
    python bench/inrank.py --ranks 4 --blocks 100   # the example as `--gpus 4` runs it
    python bench/inrank.py --floor   # beside it, what any NaN guard must pay
    python bench/inrank.py --floor --lines   # and where in the step each job's cost falls
    python bench/inrank.py --floor --bucket-view   # DDP's gradients as views of its buckets (guard.Flat)
    python bench/inrank.py --model gpt --floor --blocks 100   # nanoGPT's loop (bench/gpt_job.py), on a GPU
    python bench/inrank.py --floor --instructions --blocks 6   # instructions a step, not time (bench/instructions.py)
    python bench/inrank.py --model fsdp2 --floor --agree --ranks 2 --blocks 100   # an FSDP2 step (bench/fsdp2_job.py)
    python bench/inrank.py --model fsdp2 --floor --blocks 100   # one rank's: its periodic work and counts too

The medians of blocks leave out what happens only now and then, since
few blocks hold it: the sender's thread building and sending the records
every flush interval, and the parameter checksum every 100 steps. So the
bench then reports those apart: the sender thread's CPU time per step
over a few flush intervals of the instrumented job training alone, and the
checksum's cost on the job's model (warm). Last, it times the heartbeat's
look at the main thread (trainer/where.py) from another thread while the
instrumented job trains: the one in-rank cost that is not on the training
thread's path but holds the GIL once a second.

With --instructions it runs its rotation again under valgrind's callgrind
and reports each job's instructions a step on the training thread, which
do not move with the machine's load as its clocks do (instructions.py): a
few blocks weigh a change that the clocks need hundreds for. Nothing after
the rotation runs then.

With --ranks N it runs itself under torchrun with N ranks on gloo (one GPU
each on CUDA), all ranks alternating in step, since every step all-reduces.

The instrumented job gets ddptop's optimizer hooks on its own optimizer
(the launcher registers them globally, for every optimizer; the dispatch
costs the same), and monitor.step() is bound to ddptop only during its
blocks. It uses CUDA (NCCL) when torch sees a GPU, gloo otherwise.

--floor adds one more job to the rotation, built before ddptop's hooks so
that none of ddptop's code touches it: a plain DDP step plus one fused
grad norm (torch's _foreach_norm and the norm of the norms, as
clip_grad_norm_ takes it) before each optimizer step, read late: on a GPU
copied into a pinned buffer made once, with an event made once and
recorded on a stream looked up once, and read at the next step once the
event has passed; on the CPU read at once. A
NaN/Inf verdict on every step is what ddptop is asked for; this job costs
what any guard that gives one must, so ddptop's cost can be read against
it in the same run.

--graph-floor (a GPU only) adds the floor's norm as one CUDA graph, replayed
while the gradients keep their addresses (bench/floors.py): what a guard
whose launches do not grow with the model's tensors would pay.

Last it counts what a GPU pays for even where a CPU's clock cannot see it:
ddptop's Python calls on the training thread (sys.setprofile: calls whose
code is in ddptop's folders) and its torch ops (a TorchDispatchMode, the
instrumented job's ops less the plain job's), per step, over steady steps
of a DDP MLP of 8 layers with AdamW, its gradients in 2 and then in 8
buckets: what grows with the buckets is paid per bucket. Then in 2 buckets
with the last half of the layers used every other step (DDP's
find_unused_parameters): the optimizer's count of gradients alternates,
which should cost no more calls than a count that stays.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import itertools
import math
import os
import random
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import instructions
from floors import AgreeFloor, Floor, GraphFloor, ShardFloor
from overhead import device
from scratch import scratch_folder

REPO = Path(__file__).resolve().parent.parent


LINES = ("next batch", "model(x)", "loss, zero_grad", "loss.backward()", "optimizer.step()", "monitor.step()")
"""The lines of the example's step --lines times, as Job.run_lines splits it."""


class Job:
    """One copy of the example's training loop: model, optimizer, data."""

    LINES = LINES

    def __init__(self, args: argparse.Namespace, example: Any, torch_device: Any) -> None:
        import torch
        from torch import nn

        torch.manual_seed(0)
        self.device = torch_device
        self.model = torch.nn.parallel.DistributedDataParallel(
            example.make_model(args.width).to(torch_device), gradient_as_bucket_view=args.bucket_view
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        data_args = argparse.Namespace(seed=0, samples=max(8192, 2 * args.batch_size), batch_size=args.batch_size)
        loader = example.make_loader(data_args, torch.distributed.get_rank(), torch.distributed.get_world_size())
        self.data = example.batches(loader, 0, 0)

    def one_loss(self) -> Any:
        """A forward's loss, with its graph."""
        _, _, (x, y) = next(self.data)
        return self.loss_fn(self.model(x.to(self.device)), y.to(self.device))

    def run(self, steps: int) -> None:
        from ddptop.trainer import monitor

        for _ in range(steps):
            _, _, (x, y) = next(self.data)
            x, y = x.to(self.device), y.to(self.device)
            loss = self.loss_fn(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            monitor.step(loss=loss, samples=x.shape[0])

    def run_lines(self, steps: int, took: dict[str, list[float]]) -> None:
        """run(), with each line's wall time added to took[line]: where a job's
        cost falls in the step, torch's own time included (--lines)."""
        from ddptop.trainer import monitor

        clock = time.perf_counter
        for _ in range(steps):
            t0 = clock()
            _, _, (x, y) = next(self.data)
            x, y = x.to(self.device), y.to(self.device)
            t1 = clock()
            output = self.model(x)
            t2 = clock()
            loss = self.loss_fn(output, y)
            self.optimizer.zero_grad(set_to_none=True)
            t3 = clock()
            loss.backward()
            t4 = clock()
            self.optimizer.step()
            t5 = clock()
            monitor.step(loss=loss, samples=x.shape[0])
            t6 = clock()
            for line, start, end in zip(LINES, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6)):
                took[line].append(end - start)


def new_job(args: argparse.Namespace, example: Any, torch_device: Any) -> Any:
    """One copy of the loop --model names: the example's (Job), gpt_train's (gpt_job.GptJob), or
    the example's sharded by FSDP2 (fsdp2_job.Fsdp2Job)."""
    if args.model == "gpt":
        from gpt_job import GptJob

        return GptJob(args, torch_device)
    if args.model == "fsdp2":
        from fsdp2_job import Fsdp2Job

        return Fsdp2Job(args, example, torch_device)
    return Job(args, example, torch_device)


def instrumented(args: argparse.Namespace, example: Any, torch_device: Any) -> tuple[Job, Callable[[bool], None], Any, dict[str, Any]]:
    """ddptop's hooks on a fresh Job; the function turns monitor.step's binding on and off; the job's
    tracker; ddptop's optimizer hooks, to register on another instrumented optimizer."""
    from ddptop.core.policy import GuardPolicy
    from ddptop.trainer import hooks, monitor
    from ddptop.trainer.sampled import Sampled

    without(args.without)
    optimizer_hooks = caught_optimizer_hooks()
    sampled = Sampled()
    tracker = sending_tracker(sampled)
    probe = hooks.install(tracker, GuardPolicy(on_nan=args.on_nan), sampled)
    job = new_job(args, example, torch_device)
    job.optimizer.register_step_pre_hook(optimizer_hooks["pre"])
    job.optimizer.register_step_post_hook(optimizer_hooks["post"])
    optimizer_hooks["probe"] = probe
    return job, lambda on: monitor.bind(tracker if on else None), tracker, optimizer_hooks


def caught_optimizer_hooks() -> dict[str, Any]:
    """ddptop's optimizer pre- and post-hook, caught as hooks.install() registers them
    (to be filled by it), for one job's optimizer instead of every optimizer's."""
    from ddptop.trainer import hooks

    caught: dict[str, Any] = {}
    handle = types.SimpleNamespace(remove=lambda: None)  # what patches.py keeps to undo a registration
    hooks.register_optimizer_step_pre_hook = lambda hook: caught.setdefault("pre", hook) and handle
    hooks.register_optimizer_step_post_hook = lambda hook: caught.setdefault("post", hook) and handle
    return caught


def sending_tracker(sampled: Any) -> Any:
    """A StepTracker whose records a real Sender builds and sends, as in a rank (with what it samples
    once a second), to a socket drained here."""
    import socket
    import threading

    from ddptop.trainer.sender import Sender
    from ddptop.trainer.steps import StepTracker

    path = os.path.join(scratch_folder("ddptop-inrank-"), "sink.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def drain() -> None:
        connection, _ = server.accept()
        while connection.recv(1 << 20):
            pass

    threading.Thread(target=drain, daemon=True).start()
    sender: Sender
    tracker = StepTracker(0, emit=lambda record: sender.put(record))
    hello = {"type": "rank_hello", "rank": 0, "world_size": 1}
    heartbeat = lambda: {"type": "heartbeat", "rank": 0, "wall": time.time()}  # noqa: E731
    sender = Sender(f"unix:{path}", hello, heartbeat, collect=lambda: tracker.build(sampled.read()))
    flush = sender._flush

    def timed_flush(final: bool) -> None:
        start = time.thread_time()
        flush(final)
        FLUSHING[0] += time.thread_time() - start

    sender._flush = timed_flush  # type: ignore[method-assign]
    if not instructions.under_callgrind():  # see instructions.py: counted, its wall-clock turns would weigh fifty-fold
        sender.start()
    return tracker


FLUSHING = [0.0]
"""Seconds of the sender thread's CPU inside its flushes, apart from its waits between them: making
and encoding records, Python that holds the GIL, and the socket's system calls, which let it go (a
quarter of a flush on this VM at 42 ms steps). On a VM waking from a timed wait costs a thread
tens of microseconds of CPU that hold no GIL."""


def floored(args: argparse.Namespace, example: Any, torch_device: Any, hook: Floor) -> Job:
    """A Job whose optimizer steps after hook (a floor, floors.py); made before ddptop's hooks go in."""
    job = new_job(args, example, torch_device)
    job.optimizer.register_step_pre_hook(hook)
    return job


def without(parts: list[str]) -> None:
    """Leave parts of ddptop's instrumentation out, to attribute its cost:
    `guard` skips the NaN/Inf guard (no grad norm, no packed loss)."""
    from ddptop.trainer import optimizer_step

    if "guard" in parts:
        optimizer_step._guard = lambda probe, optimizer: {}


Counted = dict[tuple[int, bool], tuple[float, float, list[tuple[str, float]]]]
"""By buckets and whether the model's last half sits out every other step: ddptop's Python calls
and torch ops a step, and the ops it adds by name, most first."""


def counts(optimizer_hooks: dict[str, Any], torch_device: Any, bucket_view: bool, steps: int = 100) -> tuple[Counted, float]:
    """By buckets (2, 8): ddptop's Python calls and torch ops a step on the training thread (see above),
    with the ops the instrumented run made beyond the plain one's by name (a count that moves between
    runs says what moved it); and of those ops, the parameter checksum's share, averaged over the
    steps between two checksums. Then the same in 2 buckets with the model's last half used every
    other step (DDP's find_unused_parameters): an optimizer whose count of gradients alternates,
    which must cost no more a step than one whose count stays.

    The checksum covers every DDP model the rank built, so while counting it is pointed at the
    counted model alone: a one-model job's count, not one that includes the bench's other jobs."""
    import torch
    from torch import nn

    from ddptop.core.policy import GuardPolicy
    from ddptop.trainer import guard, patches

    width, layers = 256, 8
    layer_bytes = (width * width + width) * 4
    found: Counted = {}
    probe = optimizer_hooks["probe"]
    jobs_models = probe.models

    class Mlp(nn.Module):
        """The counted MLP; `whole=False` runs its first half alone."""

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])

        def forward(self, x: Any, whole: bool = True) -> Any:
            return self.layers(x) if whole else self.layers[: layers // 2](x)

    for buckets, every_other in ((2, False), (8, False), (2, True)):

        def make(hooked: bool, buckets: int = buckets, every_other: bool = every_other) -> tuple[Any, Any]:
            torch.manual_seed(0)
            module = Mlp().to(torch_device)
            with contextlib.nullcontext() if hooked else patches.suspended():
                model = torch.nn.parallel.DistributedDataParallel(
                    module,
                    bucket_cap_mb=layer_bytes * (layers // buckets) / 2**20 * 0.999,
                    gradient_as_bucket_view=bucket_view,
                    find_unused_parameters=every_other,
                )
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            if hooked:
                optimizer.register_step_pre_hook(optimizer_hooks["pre"])
                optimizer.register_step_post_hook(optimizer_hooks["post"])
            return model, optimizer

        def run(model: Any, optimizer: Any, n: int, hooked: bool, every_other: bool = every_other) -> None:
            x = torch.randn(32, width, device=torch_device)
            with contextlib.nullcontext() if hooked else patches.suspended():
                for step in range(n):
                    optimizer.zero_grad(set_to_none=True)
                    model(x, not every_other or step % 2 == 0).pow(2).mean().backward()
                    optimizer.step()

        calls = 0
        ops: dict[bool, collections.Counter[str]] = {}
        for hooked in (False, True):
            model, optimizer = make(hooked)
            if hooked:
                probe.models = probe.models[-1:]  # the model just built, registered by ddptop's DDP hook
            # Steady: buckets rebuilt, DDP's sampled iterations 1-10 past, and a checksum step made, so
            # that the pinned ring of each pack's shape (late.py: RING_SLOTS slots and their events, made
            # once) is made before the count, not in it.
            run(model, optimizer, 20 + GuardPolicy().desync_every, hooked)
            ops[hooked] = ops_counted(functools.partial(run, model, optimizer, steps, hooked))
            if hooked:
                calls = calls_into_ddptop(functools.partial(run, model, optimizer, steps, hooked))
            sizes = str(model._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
            assert every_other or len(sizes.split(",")) == buckets, sizes  # DDP rebuilds no buckets for unused parameters
        found[buckets, every_other] = (calls / steps, (ops[True].total() - ops[False].total()) / steps, added(ops[True], ops[False], steps))
    checksum_ops = ops_counted(lambda: guard.checksum_parts(probe.parameters())).total() / GuardPolicy().desync_every
    probe.models = jobs_models
    return found, checksum_ops


def measure(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "examples"))
    import torch
    import torch.distributed as dist
    import train as example

    from ddptop.core.policy import GuardPolicy
    from ddptop.trainer import patches
    from ddptop.trainer.sender import flush_interval

    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch_device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    leader = dist.get_rank() == 0
    jobs = {"plain": new_job(args, example, torch_device)}
    sharded = args.model == "fsdp2"
    if args.floor:
        jobs[FLOOR] = floored(args, example, torch_device, ShardFloor(cuda) if sharded else Floor(cuda))
    if args.agree:
        jobs[AGREE] = floored(args, example, torch_device, AgreeFloor(cuda))
    graphed = GraphFloor() if args.graph_floor else None
    if graphed is not None:
        jobs[GRAPH_FLOOR] = floored(args, example, torch_device, graphed)
    hooked, bind, tracker, optimizer_hooks = instrumented(args, example, torch_device)
    jobs["ddptop"] = hooked

    names = jobs["plain"].LINES
    lines: dict[Job, dict[str, list[float]]] = {job: {line: [] for line in names} for job in jobs.values()}
    counting = instructions.under_callgrind()
    marks: Callable[[], None] = lambda: None  # noqa: E731 - instructions.mark once the rotation begins, under callgrind

    def block(job: Job, steps: int) -> tuple[float, float]:
        bind(job is hooked)
        if job is not hooked and (timer := optimizer_hooks["probe"].sampled.collectives).armed:
            timer.disarm()  # a sharded step's timing (collective_timer.py) ends at ddptop's job's next step: not in another job's
        # ddptop replaces class methods (DDP.forward) and torch.autograd.backward, which every job calls.
        with contextlib.nullcontext() if job is hooked else patches.suspended():
            job.run(args.warmup_steps)
            if cuda:
                torch.cuda.synchronize()
            marks()
            wall, cpu = time.perf_counter(), time.process_time()
            if args.lines:
                job.run_lines(steps, lines[job])
            else:
                job.run(steps)
            if cuda:
                torch.cuda.synchronize()
            marks()
        return (time.perf_counter() - wall) / steps * 1e3, (time.process_time() - cpu) / steps * 1e3

    for job in jobs.values():
        block(job, 50)
        lines[job] = {line: [] for line in names}
    if args.torch_profile:
        if leader:
            torch_profile(jobs, block, cuda, args.block_steps, args.warmup_steps)
        dist.destroy_process_group()
        return
    if args.profile and leader:
        profile(lambda: block(hooked, 2000))
    elif args.profile:
        block(hooked, 2000)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in jobs}
    order = list(jobs.items())
    before: dict[str, list[tuple[float, float]]] | None = None
    ran: list[str] = []
    if counting:
        marks = instructions.mark
    for i in range(args.blocks):
        if args.capture and i == args.blocks // 2:  # the rotation's second half comes after a capture
            before, times = times, {name: [] for name in jobs}
            capture(optimizer_hooks["probe"].captures, hooked, block)
        # Each job takes each place in the rotation equally often.
        shift = i % len(order)
        for name, job in order[shift:] + order[:shift]:
            times[name].append(block(job, args.block_steps))
            ran.append(name)
    if counting:  # the parent reads the counts; the clocks under callgrind say nothing
        instructions.save_labels(counting, ran, args.block_steps)
        dist.destroy_process_group()
        return
    world = dist.get_world_size()
    if leader:  # first: what follows takes longer, and a run cut short keeps this
        if before is not None:
            print(f"before a profiler capture of ddptop's job ({len(before['plain'])} blocks):")
            report(args, world, before)
            print(f"after it ({len(times['plain'])} blocks):")
        report(args, world, times)
        if args.lines:
            report_lines({name: lines[job] for name, job in jobs.items()})
        if graphed is not None:
            print(f"{GRAPH_FLOOR}: {graphed.said()}")
        sys.stdout.flush()
    if sharded and world > 1:
        # What follows runs each rank for a time, not a count of steps: a sharded model's ranks
        # would fall out of step in its all-gathers. `--ranks 1` gives them for a sharded step.
        dist.destroy_process_group()
        return
    bind(True)
    sender_us, flushing_us = sender_cost(hooked, tracker, args.block_steps)
    checksum_us = checksum_cost(hooked)
    sampled = heartbeat_samples(lambda: hooked.run(args.block_steps))
    counted, checksum_ops = counts(optimizer_hooks, torch_device, args.bucket_view) if world == 1 and not sharded else ({}, 0.0)
    sharded_counted = sharded_counts(jobs["plain"], hooked) if sharded else None
    loss_us = zero_code_cost(hooked)  # last: its stand-in backward stays among patches.py's replacements
    dist.destroy_process_group()
    if leader:
        every = GuardPolicy().desync_every
        print(
            "periodic work, which the medians of blocks leave out (a block seldom holds it): "
            f"the sender's thread, {sender_us:.1f} µs of its own CPU a step (it builds and sends the records "
            f"every {flush_interval(1) * 1e3:.0f} ms), of which {flushing_us:.1f} inside its flushes (mostly holding the GIL), "
            "and the rest its waits between them; "
            f"the parameter checksum every {every} steps, {checksum_us:.0f} µs warm ({checksum_us / every:.1f} µs a step)"
        )
        print(
            f"heartbeat's look at the main thread (trainer/where.py), on ddptop's thread once a second: "
            f"median {statistics.median(sampled) * 1e6:.1f} µs a look ({len(sampled)} looks while the job trained), "
            f"{statistics.median(sampled) * 100:.4f}% of each second"
        )
        print(
            f"zero-code loss, per step on the training thread: {loss_us:.2f} µs to add the loss "
            f"backward() was called on (the wrapper around torch.autograd.backward, less the backward)"
        )
        if counted:
            report_counts(counted, checksum_ops, every)
        if sharded_counted is not None:
            calls, ops, by_name = sharded_counted
            named = ", ".join(f"{name} {count:.2f}" for name, count in by_name[:OPS_NAMED]) or "none"
            print(
                f"ddptop on the training thread, a step of the FSDP2 job ({world} ranks), {SHARDED_COUNTED} steady steps: "
                f"{calls:.1f} Python calls into ddptop and {ops:.1f} torch ops; the ops it added, by name: {named}"
            )


def report_counts(counted: Counted, checksum_ops: float, every: int) -> None:
    ((few, _), (calls_few, ops_few, _)), ((many, _), (calls_many, ops_many, _)) = sorted(
        (layout, count) for layout, count in counted.items() if not layout[1]
    )
    per_bucket = ((calls_many - calls_few) / (many - few), (ops_many - ops_few) / (many - few))
    print(
        "ddptop on the training thread, a step of a DDP MLP (8 layers, AdamW), 100 steady steps: "
        f"{few} buckets {calls_few:.1f} Python calls into ddptop and {ops_few:.1f} torch ops; "
        f"{many} buckets {calls_many:.1f} calls, {ops_many:.1f} ops; per bucket {per_bucket[0]:.2f} calls, {per_bucket[1]:.2f} ops; "
        f"of the ops, the checksum's every {every} steps, averaged: {checksum_ops:.2f} a step"
    )
    calls_alternating, ops_alternating, _ = counted[few, True]
    print(
        f"  the last half of its layers used every other step (find_unused_parameters), {few} buckets: "
        f"{calls_alternating:.1f} calls, {ops_alternating:.1f} ops a step"
    )
    for (buckets, every_other), (_, _, by_name) in sorted(counted.items()):
        named = ", ".join(f"{name} {count:.2f}" for name, count in by_name[:OPS_NAMED]) or "none"
        print(
            f"  the ops ddptop added a step, {buckets} buckets{', half the layers every other step' if every_other else ''}, by name: {named}"
        )


SHARDED_COUNTED = 50
"""Steps sharded_counts counts over."""


def sharded_counts(plain: Job, hooked: Job, steps: int = SHARDED_COUNTED) -> tuple[float, float, list[tuple[str, float]]]:
    """ddptop's Python calls and torch ops a step of the FSDP2 job on the training thread (as
    counts() counts a DDP job's), the instrumented job's ops less the plain one's, by name: run on
    the bench's own two jobs, since a sharded model's every rank must step alike. The counts of
    both jobs' ops include FSDP2's own dispatches of DTensor ops, which are alike in both."""
    from ddptop.trainer import patches

    with patches.suspended():
        plain.run(steps)
        of_plain = ops_counted(lambda: plain.run(steps))
    hooked.run(steps)
    of_hooked = ops_counted(lambda: hooked.run(steps))
    calls = calls_into_ddptop(lambda: hooked.run(steps))
    return calls / steps, (of_hooked.total() - of_plain.total()) / steps, added(of_hooked, of_plain, steps)


def ops_counted(run: Callable[[], Any]) -> collections.Counter[str]:
    """The torch ops run() dispatches on this thread, by name (a TorchDispatchMode round it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names: collections.Counter[str] = collections.Counter()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            names[str(func)] += 1
            return func(*args, **(kwargs or {}))

    with Ops():
        run()
    return names


def calls_into_ddptop(run: Callable[[], Any]) -> int:
    """Python calls into ddptop's modules while run() runs on this thread (sys.setprofile)."""
    from ddptop.core.places import is_ddptop

    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" and is_ddptop(frame.f_code.co_filename):
            calls += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def added(hooked: collections.Counter[str], plain: collections.Counter[str], steps: int) -> list[tuple[str, float]]:
    """The ops the instrumented run made beyond the plain one's, a step each, by name, most first."""
    more = hooked - plain
    return [(name, count / steps) for name, count in more.most_common()]


OPS_NAMED = 6
"""Op names the count's report gives, the most added first."""


def sender_cost(job: Job, tracker: Any, steps: int, flushes: int = 20) -> tuple[float, float]:
    """µs of the sender thread's CPU per instrumented step, over `flushes` flush intervals of the
    job training alone: what the blocks' medians leave out, since a flush falls in few blocks.
    And of it, the µs inside its flushes (FLUSHING), mostly Python that holds the GIL."""
    import threading

    from ddptop.trainer.sender import flush_interval

    thread = next(t for t in threading.enumerate() if t.name == "ddptop-sender")
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    first_step, first_cpu, first_flushing = tracker.step, time.clock_gettime(clock), FLUSHING[0]
    deadline = time.monotonic() + flushes * flush_interval(1)
    while time.monotonic() < deadline:
        job.run(steps)
    stepped = tracker.step - first_step
    return (time.clock_gettime(clock) - first_cpu) / stepped * 1e6, (FLUSHING[0] - first_flushing) / stepped * 1e6


def checksum_cost(job: Job, calls: int = 200) -> float:
    """µs a call of the guard's parameter checksum on the job's model, warm, in a loop."""
    from ddptop.trainer import guard

    start = time.perf_counter()
    for _ in range(calls):
        guard.checksum(job.model.parameters())
    return (time.perf_counter() - start) / calls * 1e6


def zero_code_cost(job: Job, calls: int = 100_000) -> float:
    """µs a call of what the zero-code loss adds, on the job's own loss tensor.

    The backward wrapper is timed around a backward that does nothing, so
    what is left is ddptop's: handing the tensor to the step, to be checked
    and read as the step closes or its record is built. Timed warm, in a
    loop: in the job, between torch's kernels, the same lines run cold and
    cost more (docs/benchmarks.md).
    """
    import torch

    from ddptop.core.policy import GuardPolicy
    from ddptop.trainer import hooks
    from ddptop.trainer.steps import StepTracker

    loss = job.one_loss()
    probe = hooks.Probe(StepTracker(0, emit=lambda record: None), GuardPolicy())
    probe.tracker.forward_begin(None)
    original = torch.autograd.backward
    try:
        torch.autograd.backward = lambda tensors, *args, **kwargs: None
        hooks._wrap_backward(probe)
        wrapped = torch.autograd.backward
        start = time.perf_counter()
        for _ in range(calls):
            probe.tracker.losses.clear()  # each call a step's one backward, not an accumulation of them all
            wrapped(loss)
        with_wrapper = time.perf_counter() - start
    finally:
        torch.autograd.backward = original
    return with_wrapper / calls * 1e6


def heartbeat_samples(train: Callable[[], None], looks: int = 2000) -> list[float]:
    """Wall seconds of each of `looks` samples of the main thread taken from another thread while it trains.

    The heartbeat takes one a second; the training thread is held for at most
    that long (the look holds the GIL), so its cost to training is this per second.
    """
    import threading

    from ddptop.trainer import where

    took: list[float] = []
    done = threading.Event()

    def look() -> None:
        for _ in range(looks):
            start = time.perf_counter()
            where.sample()
            took.append(time.perf_counter() - start)
        done.set()

    threading.Thread(target=look, daemon=True).start()
    while not done.is_set():
        train()
    return took


def profile(run: Callable[[], Any]) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(run)
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumtime").print_stats("trainer", 20)


def torch_profile(jobs: dict[str, Any], block: Callable[[Any, int], Any], cuda: bool, steps: int, warmup: int) -> None:
    """--torch-profile: a block of each job's steps under torch.profiler, its training thread's time by op.

    On a GPU host an op of the guard costs several times more between a step's kernels than
    in a loop of its own (bench/opcost.py), and the lines of the step cannot say which. Here
    each op's and each CUDA runtime call's own CPU time a step is set side by side for the
    jobs: what the floor and ddptop add over the plain job is in the rows that grow. The
    device's busy time a step (its kernels and copies) against the wall says whether the step
    waits for the GPU (then an op costs its kernel) or for its host (then its launch)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profiler

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    profiled = steps + warmup  # block() runs its untimed steps first, under the profiler too
    for name, job in jobs.items():
        with torch_profiler(activities=activities) as prof:
            started = time.perf_counter()
            block(job, steps)
            took = time.perf_counter() - started
        device_us = sum(event.device_time_total for event in prof.events() if event.device_type != DeviceType.CPU) / profiled
        print(
            f"== {name}: {profiled} steps under torch.profiler (with its own cost): {took / profiled * 1e6:.0f} us a step of wall, "
            f"the device busy {device_us:.0f} us a step; the CPU columns' totals are of all {profiled} steps"
        )
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    sys.stdout.flush()


def model(args: argparse.Namespace) -> str:
    """The jobs' loop and its size, as the report's first line says it."""
    if args.model == "gpt":
        return f"gpt_train's loop, {args.layers} layers x {args.width}, {args.heads} heads, batch {args.batch_size} x {args.context}"
    if args.model == "fsdp2":
        how = f"HSDP, {args.hsdp} replicas" if args.hsdp > 1 else "FSDP2"
        return (
            f"the example's MLP sharded by {how} (fully_shard on each Linear, then the model), width {args.width}, batch {args.batch_size}"
        )
    return f"the example's MLP, width {args.width}, batch {args.batch_size}"


def report(args: argparse.Namespace, world: int, times: dict[str, list[tuple[float, float]]]) -> None:
    left_out = f"; without {', '.join(args.without)}" if args.without else ""
    ranks = "one rank" if world == 1 else f"rank 0 of {world}"
    print(
        f"{ranks} on {device()} ({args.threads} CPU thread), {model(args)}, --on-nan {args.on_nan}{left_out}; "
        f"{args.blocks} alternating blocks of {args.block_steps} steps each, after {args.warmup_steps} untimed"
    )
    print(f"{'ms/step, median of blocks':<28}{'plain':>9}{'job':>9}{'cost µs':>9}{'ratio':>8}")
    plain = [statistics.median(t[index] for t in times["plain"]) for index in (0, 1)]
    for name in (name for name in times if name != "plain"):
        print(name)
        for index, clock in enumerate(("wall", "cpu")):
            cost = statistics.median(t[index] for t in times[name])
            print(f"  {clock:<26}{plain[index]:>9.3f}{cost:>9.3f}{(cost - plain[index]) * 1e3:>9.0f}{plain[index] / cost:>8.3f}")
        paired = sorted(h[0] - p[0] for p, h in zip(times["plain"], times[name]))
        quartiles = statistics.quantiles(paired, n=4)
        print(
            f"  wall cost of the same round's blocks, µs: median {statistics.median(paired) * 1e3:.0f}, "
            f"quartiles {quartiles[0] * 1e3:.0f} to {quartiles[2] * 1e3:.0f}"
        )
        slower, low, high = resampled(times, lambda picked, job=name: wall(times, job, picked) / wall(times, "plain", picked))
        print(f"  job / plain, wall: {slower:.4f}; {low:.4f} to {high:.4f} over {RESAMPLES} resamplings of the rounds")
    if FLOOR in times:
        ratio, low, high = cost_ratio(times, "ddptop", FLOOR)
        top = f"{high:.2f}x" if math.isfinite(high) else "no bound (the floor's cost came to 0 or less in some)"
        print(
            f"ddptop's wall cost over the floor's ({FLOOR}): {ratio:.2f}x; "
            f"{low:.2f}x to {top} over {RESAMPLES} resamplings of the rounds (5th to 95th percentile; more blocks, a narrower range)"
        )
    print(f"1% of the plain step: {plain[0] * 10:.0f} µs")


def capture(captures: Any, hooked: Job, block: Callable[[Job, int], Any]) -> None:
    """A profiler capture of 10 of the instrumented job's steps (trainer/profiling.py), run to its end."""
    captures.ask({"id": "bench", "steps": 10, "folder": scratch_folder("ddptop-inrank-profile-")})
    while captures.active:
        block(hooked, 1)
    if captures._writing is not None:
        captures._writing.join()


FLOOR = "+ fused norm, late"
"""The job that costs what any guard judging every step's gradients must."""

AGREE = "+ shard norm, flag all-reduced"
"""The sharded floor with its non-finite flag all-reduced (floors.AgreeFloor): what keeping a
non-finite step of a sharded model from the weights on every rank costs at least."""

GRAPH_FLOOR = "+ norm as a CUDA graph"
"""The floor's norm replayed as one CUDA graph (floors.py): what that design could save the floor."""

RESAMPLES = 1000


def wall(times: dict[str, list[tuple[float, float]]], job: str, picked: list[int]) -> float:
    """job's median wall time a step over the rounds picked."""
    return statistics.median(times[job][i][0] for i in picked)


def resampled(times: dict[str, list[tuple[float, float]]], statistic: Callable[[list[int]], float]) -> tuple[float, float, float]:
    """statistic over every round, and its 5th and 95th percentiles when the rounds are drawn
    again with replacement (a bootstrap): how far a run of as many rounds could read otherwise.
    On a GPU host the blocks spread by more than the 1% a job may cost: whether a job/plain
    of 1.02 says more than 1.00 is what the interval tells."""
    rounds = len(times["plain"])
    draw = random.Random(0)
    drawn = sorted(statistic(draw.choices(range(rounds), k=rounds)) for _ in range(RESAMPLES))
    return statistic(list(range(rounds))), drawn[RESAMPLES // 20], drawn[RESAMPLES - 1 - RESAMPLES // 20]


def cost_ratio(times: dict[str, list[tuple[float, float]]], job: str, floor: str) -> tuple[float, float, float]:
    """job's wall cost over floor's, each its median of blocks less the plain job's, with its
    interval over resamplings (resampled).

    A run's ratio is only as firm as its floor, a few tens of µs read off blocks that
    vary by a hundred: with a few hundred rounds a run's floor moves by ten µs or more
    from one run to the next, and the ratio by a third. The interval says how far.
    """

    def ratio(picked: list[int]) -> float:
        plain = wall(times, "plain", picked)
        floor_cost = wall(times, floor, picked) - plain
        return (wall(times, job, picked) - plain) / floor_cost if floor_cost > 0 else math.inf

    return resampled(times, ratio)


def report_lines(lines: dict[str, dict[str, list[float]]]) -> None:
    """Each line's median per job, and each job's difference from the one before it
    (the floor's from the plain job's, ddptop's from the floor's): what the whole
    costs line by line, where timings of its places alone would leave out
    what ddptop's code makes torch's own code cost after it. On CUDA these are
    the host's times, which end as each kernel is queued."""
    names = list(lines)
    medians = {name: {line: statistics.median(took) * 1e6 for line, took in lines[name].items()} for name in names}

    def row(label: str, values: dict[str, float]) -> None:
        cells = [f"{values[names[0]]:>17.1f}"]
        cells += [f"{values[name]:>9.1f} ({values[name] - values[before]:+5.1f})" for before, name in itertools.pairwise(names)]
        print(f"{label:<28}" + "".join(cells))

    print(f"{'µs a step, median by line':<28}" + "".join(f"{name[:16]:>17}" for name in names))
    for line in lines[names[0]]:
        row(line, {name: medians[name][line] for name in names})
    row("sum of the lines", {name: sum(medians[name].values()) for name in names})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        choices=("mlp", "gpt", "fsdp2"),
        default="mlp",
        help="whose loop the jobs run: the example's MLP, bench/gpt_train.py's nanoGPT-sized GPT (bench/gpt_job.py), "
        "or the example's MLP sharded by FSDP2 (bench/fsdp2_job.py)",
    )
    parser.add_argument("--hsdp", type=int, default=1, help="with --model fsdp2: HSDP, this many replicas across")
    parser.add_argument(
        "--agree",
        action="store_true",
        help="with --model fsdp2: also run the shard floor plus one all-reduce of its non-finite flag (floors.AgreeFloor)",
    )
    parser.add_argument("--width", type=int, help="the model's width (default: the MLP's 256, the GPT's 384)")
    parser.add_argument("--batch-size", type=int, help="samples a step (default: the MLP's 32, the GPT's 64)")
    parser.add_argument("--layers", type=int, default=6, help="the GPT's layers")
    parser.add_argument("--heads", type=int, default=6, help="the GPT's attention heads")
    parser.add_argument("--context", type=int, default=256, help="the GPT's tokens a sample")
    parser.add_argument("--blocks", type=int, default=300, help="blocks per job, alternating")
    parser.add_argument("--block-steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=5, help="untimed steps that start each block (see above)")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (torchrun sets 1 per rank when a machine runs several)")
    parser.add_argument("--on-nan", default="auto", help="the guard's policy (auto never waits on CUDA; skip does)")
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        choices=("guard",),
        help="leave this part of ddptop's instrumentation out (repeatable), to attribute its cost",
    )
    parser.add_argument("--profile", action="store_true", help="first print where the instrumented loop spends its time")
    parser.add_argument(
        "--torch-profile",
        action="store_true",
        help="only profile one block of each job's steps with torch.profiler and print each one's time by op (see torch_profile)",
    )
    parser.add_argument(
        "--floor", action="store_true", help="also run a plain DDP step with one fused grad norm read late beside ddptop (see above)"
    )
    parser.add_argument(
        "--graph-floor",
        action="store_true",
        help="also run the floor's norm as one CUDA graph replayed while the gradients stay put (a GPU only; see above)",
    )
    parser.add_argument(
        "--bucket-view",
        action="store_true",
        help="build every job's DDP with gradient_as_bucket_view=True: the gradients are views of DDP's buckets, which ddptop's guard norms a bucket at a time",
    )
    parser.add_argument("--ranks", type=int, default=1, help="ranks, under torchrun when more than one")
    parser.add_argument("--lines", action="store_true", help="also time each line of the step, per job (see report_lines)")
    parser.add_argument(
        "--capture",
        action="store_true",
        help="halfway through, capture 10 steps of ddptop's job with torch.profiler; its row after that is its own (ddptop's cost after a capture)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count each job's instructions a step on the training thread under valgrind's callgrind, not its time (bench/instructions.py)",
    )
    args = parser.parse_args()
    gpt = args.model == "gpt"
    args.width = args.width or (384 if gpt else 256)
    args.batch_size = args.batch_size or (64 if gpt else 32)
    if (args.agree or args.hsdp > 1) and args.model != "fsdp2":
        parser.error("--agree and --hsdp are for a sharded model: --model fsdp2")
    if args.graph_floor:
        import torch

        if not torch.cuda.is_available():
            parser.error("--graph-floor needs a GPU: a CUDA graph replays kernels")
    if args.instructions and not instructions.under_callgrind():
        count_instructions(parser, args)
        return
    if args.ranks > 1 and "WORLD_SIZE" not in os.environ:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks)]
        sys.exit(subprocess.run([*torchrun, __file__, *sys.argv[1:]]).returncode)
    measure(args)


def count_instructions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--instructions: this bench's rotation again under callgrind, then each job's instructions a step."""
    if args.ranks > 1 or args.profile or args.torch_profile or args.capture:
        parser.error("--instructions counts one rank's rotation of blocks: leave out --ranks, --profile, --torch-profile and --capture")
    folder = instructions.counted(parser, __file__)
    print(
        f"one rank on {device()} under callgrind ({args.threads} CPU thread), {model(args)}, --on-nan {args.on_nan}; "
        f"{args.blocks} alternating blocks of {args.block_steps} steps each, after {args.warmup_steps} uncounted"
    )
    instructions.report(instructions.per_block(folder))


if __name__ == "__main__":
    main()
