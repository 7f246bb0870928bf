"""Synthetic ranks over the real wire: a supervisor's load without torch.

Each synthetic rank connects as a real one does (rank_hello, then a batch
frame every flush interval with its step records, and a heartbeat each
second; trainer/sender.py), so
the collector, the event log, the hub and any attached dashboard do the
same work as for a real job. Used by the dashboard benchmark and by tests.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from pathlib import Path

from ddptop.core import wire
from ddptop.trainer.sender import flush_interval


def hello(rank: int, world: int, ranks_per_node: int = 8) -> wire.Frame:
    return {
        "type": "rank_hello",
        "rank": rank,
        "local_rank": rank % ranks_per_node,
        "world_size": world,
        "node": rank // ranks_per_node,
        "host": f"node{rank // ranks_per_node}",
        "pid": 100_000 + rank,
        "restart": 0,
    }


def step_record(
    rank: int,
    step: int,
    step_ms: float,
    rng: random.Random,
    total_steps: int | None = None,
    nan_every: int | None = None,
    checksum_every: int | None = None,
    world: int = 1,
) -> wire.Frame:
    jitter = 1.0 + 0.05 * (rng.random() - 0.5)
    record: wire.Frame = {
        "type": "step",
        "rank": rank,
        "step": step,
        "wall": time.time(),
        "step_ms": step_ms * jitter,
        "data_ms": 0.5,
        "samples": 32,
        "loss": 2.0 * math.exp(-step / 200) + 0.1,
        "grad_norm": 1.0 + 0.1 * rng.random(),
    }
    if step % SAMPLED_EVERY == 0:  # DDP's own timings, on its sampled iterations (trainer/sampled.py)
        record.update(comm_ms=0.3 * step_ms * jitter, compute_ms=0.6 * step_ms * jitter, comm_bytes=4 << 20, comm_step=step)
    if total_steps is not None:
        record["total_steps"] = total_steps
    if checksum_every and step % checksum_every == 0:
        record["checksum"] = step * 7919  # the same on every rank: no desync
    if nan_every and step and step % nan_every == 0:  # every rank skips; one rank's own gradients were bad
        record.update(nonfinite=True, local_nonfinite=rank == (step // nan_every) % world, skipped="nan")
    return record


SAMPLED_EVERY = 10
"""A synthetic rank's steps that carry DDP's sampled timings: one in ten."""

PLACE = {
    "where": "job.py:42 in train_step",
    "stack": ["job.py:60 in <module>", "job.py:42 in train_step", "torch/nn/modules/module.py:1750 in _call_impl"],
}
"""Where a synthetic rank's main thread is, as a heartbeat says it."""


async def synthetic_rank(
    socket_path: Path,
    rank: int,
    world: int,
    rate_hz: float = 10.0,
    steps: int | None = None,
    slow_factor: float = 1.0,
    total_steps: int | None = None,
    seed: int = 0,
    nan_every: int | None = None,
    checksum_every: int | None = None,
) -> int:
    """Play one rank: `steps` steps (forever if None) at rate_hz; return steps sent.

    checksum_every adds a parameter checksum (equal on all ranks) as the
    desync check does; nan_every marks a step non-finite on every rank,
    which the watchdog turns into an alert.
    """
    rng = random.Random(seed * 100_003 + rank)
    _, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(wire.encode(hello(rank, world)))
    step_ms = 1000.0 / rate_hz * slow_factor
    loop = asyncio.get_running_loop()
    start = loop.time()
    next_heartbeat = start
    interval = flush_interval(world)
    sent = 0
    try:
        while steps is None or sent < steps:
            await asyncio.sleep(interval)
            due = int((loop.time() - start) * rate_hz / slow_factor)
            if steps is not None:
                due = min(due, steps)
            items = [step_record(rank, s, step_ms, rng, total_steps, nan_every, checksum_every, world) for s in range(sent, due)]
            sent = max(sent, due)
            if loop.time() >= next_heartbeat:
                items.append(
                    {"type": "heartbeat", "rank": rank, "wall": time.time(), "phase": "forward", "step": sent, "dropped": 0, **PLACE}
                )
                next_heartbeat += 1.0
            if items:
                writer.write(wire.encode({"type": "batch", "items": items}))
                await writer.drain()
    finally:
        writer.close()
    return sent


async def synthetic_job(
    socket_path: Path,
    world: int,
    rate_hz: float = 10.0,
    steps: int | None = None,
    slow_rank: int | None = None,
    total_steps: int | None = None,
    nan_every: int | None = None,
    checksum_every: int | None = None,
) -> list[int]:
    """All ranks of a job; slow_rank, if given, steps at a third of the rate."""
    return await asyncio.gather(
        *(
            synthetic_rank(
                socket_path,
                r,
                world,
                rate_hz,
                steps,
                3.0 if r == slow_rank else 1.0,
                total_steps,
                nan_every=nan_every,
                checksum_every=checksum_every,
            )
            for r in range(world)
        )
    )
