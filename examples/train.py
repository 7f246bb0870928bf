"""ddptop's example job: a small MLP on synthetic data, plain DDP.

Runs anywhere: NCCL on GPUs, gloo on CPU ranks. It needs no download, and
uses ddptop's optional API for the loss, exact sample counts and the step
count (for the dashboard's ETA); everything else ddptop measures alone.

    ddptop launch examples/train.py --gpus 4 --steps 200

With `--checkpoint-dir DIR --checkpoint-every N` it checkpoints through
monitor.checkpoint and, when restarted, resumes from the newest checkpoint
at the same data position (sampler epoch and offset): a run killed and
restarted ends with the same `final-params-sha256` as one never stopped.

`--inject KIND@STEP:RANK[/ATTEMPT]` (repeatable) breaks the job on purpose,
to see the watchdog at work; a fault fires in the given attempt only (the
first by default), so a restarted group runs clean:

    nan       the loss is NaN on that rank
    inf-grad  one gradient element is inf as backward produces it
    explode   the gradients are scaled by 1e6
    desync    that rank nudges one parameter after optimizer.step
    hang      that rank blocks forever before its next all-reduce
    slow      that rank sleeps 5x its step time (0.1 s at least) from then on
    crash     that rank exits with code 3
    segv      that rank kills itself with SIGSEGV
    kill      that rank kills itself with SIGKILL
    ckpt-kill rank 0 is killed with SIGKILL inside the checkpoint of that
              step, its bytes written but not yet made durable and renamed
"""

from __future__ import annotations

import time

SCRIPT_STARTED = time.time()
"""When this process began running the script (the interpreter and any sitecustomize before it): bench/restart.py's timeline."""

import argparse
import hashlib
import itertools
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddptop.trainer import monitor

TORCH_IMPORTED = time.time()

FAULTS = ("nan", "inf-grad", "explode", "desync", "hang", "slow", "crash", "segv", "kill", "ckpt-kill")
SLOW_MIN_S = 0.1


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int
    attempt: int = 0


def parse_fault(text: str) -> Fault:
    try:
        kind, _, where = text.partition("@")
        step, _, rest = where.partition(":")
        rank, _, attempt = rest.partition("/")
        fault = Fault(kind, int(step), int(rank), int(attempt or 0))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not KIND@STEP:RANK[/ATTEMPT]") from None
    if fault.kind not in FAULTS:
        raise argparse.ArgumentTypeError(f"unknown fault {fault.kind!r} (one of {', '.join(FAULTS)})")
    if min(fault.step, fault.rank, fault.attempt) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: step, rank and attempt must not be negative")
    return fault


class OneLineParser(argparse.ArgumentParser):
    """One line on a mistake, said once (by rank 0), not usage text from every rank."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if os.environ.get("RANK", "0") == "0":
            print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


class Faults:
    """The faults this rank injects in this attempt, by step."""

    def __init__(self, faults: list[Fault], rank: int, attempt: int) -> None:
        self.by_step: dict[int, set[str]] = {}
        for fault in faults:
            if fault.rank == rank and fault.attempt == attempt:
                self.by_step.setdefault(fault.step, set()).add(fault.kind)
        self.slow_s = 0.0

    def at(self, step: int, kind: str) -> bool:
        return kind in self.by_step.get(step, ())


def parse_args() -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument(
        "--optimizer",
        choices=("sgd", "adamw-fused"),
        default="sgd",
        help="SGD with momentum, or torch's fused AdamW (on a GPU ddptop skips a NaN step on the device for it)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=8192, help="size of the synthetic dataset")
    parser.add_argument("--checkpoint-dir", type=Path, help="checkpoint here, and resume from here when restarted")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="steps between checkpoints (needs --checkpoint-dir)")
    parser.add_argument(
        "--inject",
        type=parse_fault,
        action="append",
        default=[],
        metavar="KIND@STEP:RANK[/ATTEMPT]",
        help="break the job on purpose (see above)",
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.checkpoint_every < 0 or (args.checkpoint_every and args.checkpoint_dir is None):
        parser.error("--checkpoint-every takes a positive N and needs --checkpoint-dir")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.samples < world * args.batch_size:
        parser.error(f"--samples {args.samples} is less than one batch for each of {world} ranks")
    for fault in args.inject:
        if fault.rank >= world:
            parser.error(f"--inject {fault.kind}@{fault.step}:{fault.rank}: rank {fault.rank} is outside the world of {world} ranks")
        if fault.kind == "ckpt-kill" and not (fault.rank == 0 and is_checkpoint_step(args, fault.step)):
            parser.error(f"--inject ckpt-kill@{fault.step}:{fault.rank}: rank 0 writes no checkpoint at that step")
    return args


def is_checkpoint_step(args: argparse.Namespace, step: int) -> bool:
    return bool(args.checkpoint_every) and (step + 1) % args.checkpoint_every == 0


def make_model(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def make_loader(args: argparse.Namespace, rank: int, world: int) -> DataLoader:
    """A synthetic dataset from the seed, sharded and shuffled per epoch as usual."""
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, 64, generator=gen)
    y = (x[:, :10].sum(dim=1) > 0).long() + 2 * (x[:, 10:20].sum(dim=1) > 0).long()
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, seed=args.seed, drop_last=True)
    return DataLoader(sampler.dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)


def batches(loader: DataLoader, epoch: int, offset: int) -> Iterator[tuple[int, int, list[torch.Tensor]]]:
    """(epoch, offset of the next batch, batch) from a data position on, forever."""
    assert isinstance(loader.sampler, DistributedSampler)
    while True:
        loader.sampler.set_epoch(epoch)
        for index, batch in enumerate(itertools.islice(loader, offset, None), start=offset + 1):
            yield epoch, index, batch
        epoch, offset = epoch + 1, 0


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def inject_before_step(faults: Faults, step: int, step_s: float, model: nn.Module) -> None:
    """The faults that strike before the forward pass; step_s is this attempt's mean step time."""
    if faults.at(step, "slow"):
        # At least SLOW_MIN_S: on a fast machine 5 steps can be 40 ms, and a short job's
        # slow steps would then end before the watchdog's 3 s of a straggler in a row.
        faults.slow_s = max(5 * step_s, SLOW_MIN_S)
    if faults.slow_s:
        time.sleep(faults.slow_s)
    for kind, die in (
        ("crash", lambda: sys.exit(3)),
        ("segv", lambda: os.kill(os.getpid(), signal.SIGSEGV)),
        ("kill", lambda: os.kill(os.getpid(), signal.SIGKILL)),
    ):
        if faults.at(step, kind):
            print(f"injected {kind} at step {step}, wall {time.time():.3f}", file=sys.stderr, flush=True)
            die()
    if faults.at(step, "inf-grad"):
        param = next(model.parameters())

        def poison(grad: torch.Tensor) -> torch.Tensor:
            handle.remove()
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
            return grad

        handle = param.register_hook(poison)


def checkpoint(
    args: argparse.Namespace, faults: Faults, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, offset: int
) -> None:
    if faults.at(step, "ckpt-kill"):
        print(f"injected ckpt-kill at step {step}, wall {time.time():.3f}", file=sys.stderr, flush=True)
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # all bytes written, none durable
    monitor.checkpoint(model, optimizer, step=step, directory=args.checkpoint_dir, data={"epoch": epoch, "offset": offset})


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    group_joined = time.time()
    rank, world, local_rank = dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    # DDP lays out its gradient buckets in parameter order for the first step
    # and in gradient-ready order from the second on; on 3+ ranks the sums of
    # a resumed run's first step would round differently. Not re-laying them
    # out (a side effect of find_unused_parameters) keeps resumes bitwise.
    model = DistributedDataParallel(make_model(args.width).to(device), find_unused_parameters=args.checkpoint_dir is not None)
    if args.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
    loss_fn = nn.CrossEntropyLoss()
    monitor.configure(total_steps=args.steps)
    attempt = monitor.attempt()
    faults = Faults(args.inject, rank, attempt)
    start, epoch, offset = 0, 0, 0
    if args.checkpoint_dir is not None:
        resumed = monitor.resume(model, optimizer, directory=args.checkpoint_dir)
        if resumed is not None:
            start, epoch, offset = resumed.step + 1, resumed.data["epoch"], resumed.data["offset"]
            if rank == 0:
                print(f"resumed from {resumed.path.name} at step {start}", flush=True)
    if rank == 0 and attempt > 0:  # where a restart's time went, in this rank (bench/restart.py reads it)
        marks = {"script": SCRIPT_STARTED, "torch": TORCH_IMPORTED, "group": group_joined, "resumed": time.time()}
        print("restart timeline " + " ".join(f"{name}={wall:.3f}" for name, wall in marks.items()), flush=True)
    data = batches(make_loader(args, rank, world), epoch, offset)
    warmup = min(start + 10, args.steps - 1)
    started = timed_from = time.perf_counter()
    for step in range(start, args.steps):
        if step == warmup:
            timed_from = time.perf_counter()
        epoch, offset, (x, y) = next(data)
        x, y = x.to(device), y.to(device)
        inject_before_step(faults, step, (time.perf_counter() - started) / max(step - start, 1), model)
        loss = loss_fn(model(x), y)
        if faults.at(step, "nan"):
            loss = loss * float("nan")
        if faults.at(step, "explode"):
            loss = loss * 1e6
        optimizer.zero_grad(set_to_none=True)
        if faults.at(step, "hang"):
            threading.Event().wait()  # never set: the other ranks wait in the all-reduce
        loss.backward()
        optimizer.step()
        if faults.at(step, "desync"):
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1e-3
        monitor.step(loss=loss, samples=x.shape[0])
        if rank == 0 and step == start:
            print(f"first step {step} of attempt {attempt} done, wall {time.time():.3f}", flush=True)
        if is_checkpoint_step(args, step):
            checkpoint(args, faults, step, model, optimizer, epoch, offset)
        if rank == 0 and (step % 100 == 0 or step == args.steps - 1):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        rate = max(args.steps - warmup, 1) / (time.perf_counter() - timed_from)
        print(f"train-steps-per-s {rate:.2f}", flush=True)
        print(f"final-params-sha256 {params_sha256(model.module)}", flush=True)
        finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        print(f"final-params-finite {str(finite).lower()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
