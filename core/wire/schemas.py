"""What each record type may hold: the schema of every frame ddptop exchanges.

Every frame from a peer is checked here after decoding (frames.py), so
nothing malformed reaches the collector; the records the supervisor makes
itself (run, alert, summary, exit) have schemas too, so the event log a
replay or `ddptop export` reads is described in one place.
"""

from __future__ import annotations

from ddptop.core.wire.frames import MAX_BATCH, Frame, FrameError

# Field specs: (accepted Python types, required). bool is excluded from the
# numeric types explicitly because msgpack decodes true/false as bool, a
# subclass of int, and a type-confused peer must not pass as a step number.
_INT = (int,)
_NUM = (int, float)
_STR = (str,)
_BOOL = (bool,)
_LIST = (list,)
_MAP = (dict,)
_BYTES = (bytes,)

_RANK_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "rank": (_INT, True),
    "local_rank": (_INT, True),
    "world_size": (_INT, True),
    "node": (_INT, True),
    "host": (_STR, True),
    "pid": (_INT, True),
    "restart": (_INT, True),
    # When the process started (a rank forked from the template: the fork), a Unix time.
    "started": (_NUM, False),
}

SCHEMAS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    # A rank introduces itself once per connection.
    "rank_hello": _RANK_FIELDS,
    # Per-step record, built by the trainer's step tracker.
    "step": {
        "rank": (_INT, True),
        "step": (_INT, True),
        "wall": (_NUM, True),
        "step_ms": (_NUM, True),
        "data_ms": (_NUM, False),
        "samples": (_INT, False),
        "tokens": (_INT, False),
        "loss": (_NUM, False),
        "grad_norm": (_NUM, False),
        "comm_ms": (_NUM, False),
        "comm_bytes": (_INT, False),
        "mem_alloc": (_INT, False),
        "mem_reserved": (_INT, False),
        "mem_peak": (_INT, False),
        "total_steps": (_INT, False),
        # The in-rank watchdog (guard.py); clipped is sent whenever --clip-grad is on.
        "nonfinite": (_BOOL, False),
        "local_nonfinite": (_BOOL, False),
        "skipped": (_STR, False),
        "clipped": (_BOOL, False),
        "checksum": (_INT, False),
    },
    # About once a second: liveness and where the rank is.
    "heartbeat": {
        "rank": (_INT, True),
        "wall": (_NUM, True),
        "phase": (_STR, True),
        # The main thread's innermost frame of the script's code, "train.py:51 in train_step" (trainer/where.py).
        "where": (_STR, False),
        # The torch.distributed call the main thread is in ("all_reduce", "barrier").
        "inside": (_STR, False),
        # The main thread's frames, outermost first (core/places.py stack_line); only when they
        # changed since the rank's previous heartbeat.
        "stack": (_LIST, False),
        # The step in progress: the rank has finished every step before it.
        "step": (_INT, True),
        # The DDP model's forwards so far, evaluation's included.
        "forwards": (_INT, False),
        # [last enqueued, last completed] collective of the default process group, from torch's
        # flight recorder; only from a rank that has sat on one step a while (trainer/flightrecorder.py).
        "collectives": (_LIST, False),
        "dropped": (_INT, True),
    },
    # A rank's start-up, step by step: torch imported ("torch"), its process group joined ("group").
    "phase": {"rank": (_INT, True), "wall": (_NUM, True), "phase": (_STR, True)},
    # torchrun's own agent, through ddptop's probe (supervisor/launching/torchrun_probe.py).
    "agent_hello": {"node": (_INT, True)},
    # A step of starting the workers of attempt `restart` that only the agent sees: the
    # old workers "stopped", the "rendezvous" done, the new workers "started".
    "agent_phase": {"node": (_INT, True), "restart": (_INT, True), "phase": (_STR, True), "wall": (_NUM, True)},
    # What the user should know of how the agent starts workers (the template's fallback).
    "agent_note": {"node": (_INT, True), "wall": (_NUM, True), "text": (_STR, True)},
    # A worker process ended with a failure: what only torchrun knows. restart:
    # the job's attempt it ran in (the probe's count, the same on every node).
    "worker_failure": {
        "node": (_INT, True),
        "restart": (_INT, True),
        "rank": (_INT, True),
        "local_rank": (_INT, True),
        "pid": (_INT, True),
        "exitcode": (_INT, True),
        "wall": (_NUM, True),
        "message": (_STR, False),
    },
    # torchrun restarts its worker group (restart counts from 1), after backoff_s,
    # because rank failed with exitcode (torchrun's view: the first it saw).
    "group_restart": {
        "node": (_INT, True),
        "restart": (_INT, True),
        "remaining": (_INT, True),
        "wall": (_NUM, True),
        "backoff_s": (_NUM, False),
        "rank": (_INT, False),
        "exitcode": (_INT, False),
    },
    # The supervisor to torchrun's probe: it has judged the failure behind restart
    # number `restart` and not stopped the job, so the restart may go ahead.
    "restart_go": {"restart": (_INT, True)},
    # monitor.checkpoint() wrote a checkpoint (rank 0) / monitor.resume() loaded one.
    "checkpoint": {
        "rank": (_INT, True),
        "wall": (_NUM, True),
        "step": (_INT, True),
        "path": (_STR, True),
        "bytes": (_INT, True),
        "write_ms": (_NUM, True),
    },
    "resume": {"rank": (_INT, True), "wall": (_NUM, True), "step": (_INT, True), "path": (_STR, True), "damaged": (_LIST, True)},
    # The traceback of an exception the script did not catch (its end).
    "exception": {"rank": (_INT, True), "wall": (_NUM, True), "text": (_STR, True)},
    # A rank's records, sent together so the socket sees a few frames a second.
    "batch": {"items": (_LIST, True)},
    # A dashboard introduces itself; with history, it first gets the run so far.
    # history: the run's records so far first; snapshot: the job's state as a
    # few frames instead (model/snapshot.py), what a dashboard asks for.
    "viewer_hello": {"history": (_BOOL, False), "snapshot": (_BOOL, False)},
    # What a dashboard may ask of the supervisor, and the job's aggregator of a
    # node's supervisor (stacks: collect those ranks' Python stacks).
    "command": {"action": (_STR, True), "rank": (_INT, False), "ranks": (_LIST, False), "origin": (_STR, False)},
    # Over TCP, the first frame of every connection: the run's token.
    "auth": {"token": (_STR, True)},
    # A node's supervisor joins the job's aggregator (node 0's supervisor), which
    # answers node_welcome, or refused and closes; then the node forwards records.
    "node_hello": {"node": (_INT, True), "nnodes": (_INT, True), "host": (_STR, True), "pid": (_INT, True)},
    "node_welcome": {"node": (_INT, True), "run": (_STR, True)},
    "refused": {"reason": (_STR, True)},
    # Records a supervisor makes, which a node forwards to the aggregator.
    "rank_gone": {"rank": (_INT, True), "wall": (_NUM, True)},
    "sample": {"wall": (_NUM, True), "procs": (_LIST, True), "gpus": (_LIST, True), "node": (_INT, False)},
    "stack": {"rank": (_INT, True), "wall": (_NUM, True), "source": (_STR, True), "text": (_STR, True)},
    # The end of a rank's own log (its attempt's stdout and stderr), read on its node at a
    # dashboard's asking (command log_tail): sent to the dashboards, not kept in the event log.
    "log_tail": {"rank": (_INT, True), "wall": (_NUM, True), "restart": (_INT, True), "lines": (_LIST, True)},
    "action": {"wall": (_NUM, True), "text": (_STR, True), "rank": (_INT, False), "node": (_INT, False)},
    "notice": {"wall": (_NUM, True), "text": (_STR, True), "node": (_INT, False)},
    "wire_error": {"wall": (_NUM, True), "error": (_STR, True), "rank": (_INT, False), "node": (_INT, False)},
    # What the supervisor makes itself. The run record opens every event log:
    # the launch's metadata (meta.json as it was at the start).
    "run": {
        "wall": (_NUM, True),
        "id": (_STR, True),
        "script": (_STR, True),
        "args": (_LIST, False),
        "nproc_per_node": (_INT, False),
        "launch_style": (_STR, False),
        "launch_reason": (_STR, False),
        "port_set_at": (_STR, False),
        "gpus": (_INT, False),
        "nnodes": (_STR, False),
        "node_rank": (_INT, False),
        "listen": (_STR, False),
        "aggregator": (_STR, False),
        "prometheus": (_STR, False),
        "host": (_STR, False),
        "cpu_only": (_BOOL, False),
        "address": (_STR, False),
        "started": (_NUM, False),
        "supervisor_pid": (_INT, False),
        "supervisor_started": (_NUM, False),
        "state": (_STR, False),
        "version": (_STR, False),
    },
    # A watchdog verdict; the fields after action are the kind's own details.
    "alert": {
        "wall": (_NUM, True),
        "kind": (_STR, True),
        "text": (_STR, True),
        "action": (_STR, True),
        "ranks": (_LIST, True),
        "rank": (_INT, False),
        "step": (_INT, False),
        "checksums": (_MAP, False),
        "ratio": (_NUM, False),
        # stall: the window no step came in, seconds (rules/stall.py).
        "window_s": (_NUM, False),
        "exitcode": (_INT, False),
        "exit_status": (_INT, False),
        "log": (_LIST, False),
        "traceback": (_STR, False),
    },
    # The job's totals, once a second (model/totals.py); metrics: the metric
    # table's job figures by key, so a new metric needs no schema of its own.
    "summary": {
        "wall": (_NUM, True),
        "steps_done": (_INT, False),
        "total_steps": (_INT, False),
        "ranks_seen": (_INT, True),
        "world_size": (_INT, True),
        "busbw": (_NUM, False),
        "dropped": (_INT, True),
        "alerts": (_INT, True),
        "nan_skips": (_INT, True),
        "scaler_skips": (_INT, True),
        "clip_rate": (_NUM, False),
        "restarts": (_INT, True),
        "checkpoint_step": (_INT, False),
        "metrics": (_MAP, True),
        # Each rank's mean step and comm ms since the last summary, float32
        # by rank, NaN where none (model/history.py): the charts' per-rank lines.
        "rank_step_ms": (_BYTES, False),
        "rank_comm_ms": (_BYTES, False),
    },
    # The job is over: torchrun's exit status, or 128+N when stopped by signal N.
    "exit": {"wall": (_NUM, True), "code": (_INT, True), "stopped_by_signal": (_INT, False), "goodput": (_MAP, False)},
}

# The entries of a sample record's lists: one rank process, one GPU.
_SAMPLE_PROC: dict[str, tuple[tuple[type, ...], bool]] = {
    "rank": (_INT, True),
    "pid": (_INT, True),
    "cpu": (_NUM, False),
    "rss": (_INT, False),
    "gpu": (_INT, False),
    "gpu_mem": (_INT, False),
}
_SAMPLE_GPU: dict[str, tuple[tuple[type, ...], bool]] = {
    "index": (_INT, True),
    "name": (_STR, False),
    "util": (_NUM, False),
    "mem_used": (_INT, False),
    "mem_total": (_INT, False),
    "temperature": (_NUM, False),
    "power_w": (_NUM, False),
}

COMMANDS = frozenset({"stop", "restart", "kill_rank", "stacks", "log_tail"})
"""Actions a viewer may request: stop the job, restart the group, kill one rank
(and, from the aggregator to a node, collect stacks)."""

RANK_RECORD_TYPES = frozenset({"step", "heartbeat", "exception", "checkpoint", "resume", "phase"})
"""What a batch from a rank may carry."""

AGENT_RECORD_TYPES = frozenset({"worker_failure", "group_restart", "agent_phase", "agent_note"})
"""What torchrun's probe may send after its hello."""

FORWARDED_TYPES = (
    RANK_RECORD_TYPES
    | AGENT_RECORD_TYPES
    | frozenset({"rank_hello", "rank_gone", "sample", "stack", "log_tail", "action", "notice", "wire_error"})
)
"""What a node's supervisor forwards to the aggregator: its ranks' and its
torchrun's records, and what it measured and did; not its own summaries."""


_REQUIRED = {kind: frozenset(k for k, (_, required) in schema.items() if required) for kind, schema in SCHEMAS.items()}
_PROC_REQUIRED = frozenset({"rank", "pid"})
_GPU_REQUIRED = frozenset({"index"})


def validate(frame: Frame) -> Frame:
    """Check a frame from an untrusted peer against its schema; return it.

    Run on every record a supervisor receives (ten thousand a second at
    1,024 ranks), so the common case is one dict lookup and one isinstance
    per field.
    """
    kind = frame.get("type")
    if not isinstance(kind, str) or (schema := SCHEMAS.get(kind)) is None:
        raise FrameError(f"unknown frame type {kind!r}")
    _check_fields(kind, schema, frame, _REQUIRED[kind])
    if kind == "command":
        if frame["action"] not in COMMANDS:
            raise FrameError(f"unknown command {frame['action']!r}")
        if any(not isinstance(r, int) or isinstance(r, bool) for r in frame.get("ranks") or []):
            raise FrameError("command: ranks must be integers")
    elif kind == "batch":
        items = frame["items"]
        if len(items) > MAX_BATCH:
            raise FrameError(f"batch of {len(items)} records exceeds {MAX_BATCH}")
        for item in items:
            if not isinstance(item, dict) or item.get("type") not in RANK_RECORD_TYPES:
                raise FrameError("batch item is not a rank record")
            validate(item)
    elif kind == "log_tail":
        if any(not isinstance(line, str) for line in frame["lines"]):
            raise FrameError("log_tail: lines must be strings")
    elif kind == "heartbeat":
        if any(not isinstance(line, str) for line in frame.get("stack") or ()):
            raise FrameError("heartbeat: stack lines must be strings")
        seq = frame.get("collectives")
        if seq is not None and (len(seq) != 2 or any(not isinstance(n, int) or isinstance(n, bool) for n in seq)):
            raise FrameError("heartbeat: collectives must be two integers")
    elif kind == "summary":
        for key, value in frame["metrics"].items():
            if not isinstance(key, str) or not (value is None or (isinstance(value, _NUM) and value.__class__ is not bool)):
                raise FrameError(f"summary: metric {key!r} is not a number")
    elif kind == "sample":
        for key, entry_schema, required in (("procs", _SAMPLE_PROC, _PROC_REQUIRED), ("gpus", _SAMPLE_GPU, _GPU_REQUIRED)):
            for entry in frame[key]:
                if not isinstance(entry, dict):
                    raise FrameError(f"sample: an entry of {key} is not a map")
                _check_fields(f"sample {key}", entry_schema, entry, required)
    return frame


def _check_fields(kind: str, schema: dict[str, tuple[tuple[type, ...], bool]], frame: Frame, required: frozenset[str]) -> None:
    for key, value in frame.items():
        spec = schema.get(key)
        if spec is None:
            if key == "type":
                continue
            raise FrameError(f"{kind}: unknown field {key!r}")
        types = spec[0]
        if not isinstance(value, types) or (value.__class__ is bool and bool not in types):
            if value is None and not spec[1]:
                continue
            raise FrameError(f"{kind}: field {key!r} has type {type(value).__name__}")
    if not required <= frame.keys():
        missing = sorted(required - frame.keys())
        raise FrameError(f"{kind}: missing field(s) {', '.join(missing)}")
