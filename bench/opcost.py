"""What each op of the guard's GPU step costs the thread that launches it, on this host.

On a GPU the training thread does not wait for kernels, only for their launch: each op
is dispatched from Python, and a step as launch-bound as nanoGPT's on an H200 host loses
that time whole. This times each op the guard runs a step (guard.py, late.py), and the
alternatives it was chosen over, each in a loop of --calls calls after a warm-up, with
the device synchronised only around the loop.

A loop of one op runs on warm caches, so inside a real step each costs more (on an H200
host, what inrank.py finds a step's ops cost by line is several times these): the figures rank the
ops and the choices between them; they do not add up to a step's cost.

Two rows are for the norm of gradients that are views of one of DDP's buckets
(gradient_as_bucket_view=True, guard.Flat): the bucket's one reduction, and the same bucket
through torch's fused norm, which launches four kernels for it. Three are for designs not taken
yet: the guard's own norm (the fused norm of the gradients and the pack) replayed as one
captured CUDA graph, since torch's fused norm does host work for each gradient and the
graph's replay is one launch; the pack's stack and copy as one op, each value copied into its
row of the pinned slot by _foreach_copy_ (one dispatch from Python where the pack takes two; on
the H200 a dispatch costs a launch-bound step about 35 to 40 us, wherever it is made); and the
allocator's figures the sender's thread reads once a second, holding the GIL a training thread
may wait for. The last two rows are torch's fused AdamW step of nanoGPT's 76 tensors, alone
and handed a found_inf as the guard hands it for the NaN skip on the device: what that skip
costs inside torch's own step.

    python bench/opcost.py                   # on a GPU
    python bench/opcost.py --calls 2000      # on the CPU, a quick look
    python bench/opcost.py --calls 200 --instructions   # on the CPU, instructions a call (about a minute)

With --instructions each loop runs under valgrind's callgrind and its rows say how many
instructions a call does on this thread (bench/instructions.py), which the machine's load
does not move: on a CPU the ops' own work, their dispatch and their Python, counted. The
fused AdamW rows are left out then.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import instructions
import torch
from floors import capture

from ddptop.trainer import guard, sampled, torchapi


def per_call_us(run: Callable[[], Any], calls: int, sync: Callable[[], None], mark: Callable[[], None] = lambda: None) -> float:
    """Microseconds a call of run, on this thread, over calls calls after a warm-up; mark
    closes a part of callgrind's count as the calls begin and as they end (--instructions)."""
    for _ in range(max(100, calls // 40)):
        run()
    sync()
    mark()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    elapsed = time.perf_counter() - start
    mark()
    sync()
    return elapsed / calls * 1e6


def graph_row(name: str, ops: Callable[[], Any]) -> tuple[str, Callable[[], Any]]:
    """ops captured once in a CUDA graph, and the row that times its replay: what the guard's
    launches would cost the training thread as one, where its gradients stay where they were
    captured. A capture torch refuses is said in the row's name, and its replay is nothing."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warmed up off the default stream, as a capture needs
        for _ in range(3):
            ops()
    torch.cuda.current_stream().wait_stream(side)
    captured = capture(ops, side)
    if isinstance(captured, str):
        return f"{name}: not captured ({captured[:60]})", lambda: None
    return name, captured[0].replay


ADAMW_PARAMS = 76
"""nanoGPT's parameter tensors (bench/gpt_train.py's GPT at 6 layers)."""


def fused_adamw_rows(dev: torch.device, flag: torch.Tensor) -> list[tuple[str, Callable[[], Any]]]:
    """A fused AdamW step of ADAMW_PARAMS small tensors, alone and handed a found_inf (0: a finite
    step), as the guard hands one on a GPU: what the NaN skip on the device costs inside torch's
    own step, which then also subtracts found_inf from each parameter's step count (_foreach_sub_).
    Two optimizers, so that each row's step counts and moments are its own."""
    steppers = []
    for handed in (False, True):
        params = [torch.zeros(64, 64, device=dev, requires_grad=True) for _ in range(ADAMW_PARAMS)]
        for param in params:
            param.grad = torch.zeros_like(param)
        optimizer = torch.optim.AdamW(params, fused=True)
        steppers.append((optimizer, handed))

    def step(optimizer: Any, handed: bool) -> None:
        if handed:
            optimizer.found_inf = flag.zero_()
        optimizer.step()
        if handed:
            del optimizer.found_inf

    return [
        (f"fused AdamW's step of {ADAMW_PARAMS} tensors", lambda: step(*steppers[0])),
        ("the same step handed a found_inf, as the guard hands it (a zero_ more)", lambda: step(*steppers[1])),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000, help="calls of each op timed")
    parser.add_argument(
        "--tensors",
        type=int,
        default=16,
        help="gradients the fused norm takes, each 256 x 256 (16: an MLP of 8 layers, as inrank.py counts; the example's has 6)",
    )
    parser.add_argument(
        "--instructions", action="store_true", help="count each row's instructions a call under valgrind's callgrind, not its time"
    )
    args = parser.parse_args()
    counting = instructions.under_callgrind()
    if args.instructions and not counting:
        folder = instructions.counted(parser, __file__)
        print(f"instructions a call on this thread under callgrind, {args.calls} calls each")
        for name, counts in instructions.per_block(folder).items():
            print(f"{name:72s} {counts[0]:>12,.0f}")
        return
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else lambda: None
    norm, loss = torch.tensor(1.5, device=dev), torch.tensor(2.5, device=dev)
    grads = [torch.randn(256, 256, device=dev) for _ in range(args.tensors)]
    bucket = torch.cat([grad.view(-1) for grad in grads])
    packed = torch.stack((norm, loss))
    host = torch.empty(2, pin_memory=cuda)
    host_rows = list(host.unbind(0))
    flag = torch.empty((), dtype=torch.float32, device=dev)
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("a Python call that does nothing (the unit of Python)", lambda: None),
        ("one elementwise op, norm.add(1) (the unit of an op)", lambda: norm.add(1)),
        ("found_inf: ne(norm - norm, 0), 2 ops (guard.found_inf)", lambda: guard.found_inf(norm, flag)),
        ("found_inf by isfinite(norm).logical_not(), 5 ops", lambda: torch.logical_not(torch.isfinite(norm), out=flag)),
        (f"the fused norm of {args.tensors} gradients and their total (the floor's)", lambda: guard.total(guard.norms(grads))),
        (f"the {args.tensors} gradients as one bucket of DDP's: its reduction (guard.norms)", lambda: guard.norms([bucket])),
        ("the bucket through torch's fused norm instead", lambda: torch._foreach_norm([bucket])),
        ("the pack: stack of 2 scalars (guard.pack)", lambda: guard.pack([norm, loss])),
        (
            f"the guard's own norm: the fused norm of {args.tensors} gradients, packed with a loss",
            lambda: guard.pack([*guard.norms(grads), loss]),
        ),
        ("the pack's copy into a pinned slot, non_blocking", lambda: host.copy_(packed, non_blocking=True)),
        (
            "the pack and its copy: stack of a norm and a loss, then one copy",
            lambda: host.copy_(guard.pack([norm, loss]), non_blocking=True),
        ),
        (
            "the two copied into the slot's rows by one op instead, _foreach_copy_",
            lambda: torch._foreach_copy_(host_rows, [norm, loss], non_blocking=True),
        ),
    ]
    if not counting:  # a CPU's fused AdamW is its arithmetic, which callgrind would take many minutes over
        rows += fused_adamw_rows(dev, flag)
    if cuda:
        event, stream = torch.cuda.Event(), torch.cuda.current_stream()
        rows += [
            ("event.record(), which finds the current stream in Python", lambda: event.record()),
            ("event.record(stream), the stream given", lambda: event.record(stream)),
            ("torch.cuda.current_stream()", torch.cuda.current_stream),
            ("torchapi.current_stream(0), the lookup in C", lambda: torchapi.current_stream(0)),
            ("the slot's record, event.record(torchapi.current_stream(0)) (late.py)", lambda: event.record(torchapi.current_stream(0))),
            ("event.query(), the reader's look (sender thread)", event.query),
            ("the allocator's figures, sampled.memory(0) (the sender's thread, once a second)", lambda: sampled.memory(0)),
            graph_row(
                f"the same guard's norm of {args.tensors} gradients as one CUDA graph, captured once and replayed",
                lambda: guard.pack([*guard.norms(grads), loss]),
            ),
        ]
    if counting:  # the parent reads the counts; the clocks under callgrind say nothing
        for _, run in rows:
            per_call_us(run, args.calls, sync, instructions.mark)
        instructions.save_labels(counting, [name for name, _ in rows], args.calls)
        return
    print(f"{torch.cuda.get_device_name() if cuda else 'CPU'}, torch {torch.__version__}, {args.calls} calls each")
    for name, run in rows:
        print(f"{name:72s} {per_call_us(run, args.calls, sync):8.2f} us")


if __name__ == "__main__":
    main()
