"""Every record ddptop exchanges, one typed definition each: the wire's source of truth.

A record type is a TypedDict here; its schema check (schemas.py), the
model's per-step fields (model/stats.py StepPoint, model/rank.py latest)
and the tests' record builders (tests/builders.py) are derived from these
definitions, so a field is declared once. NotRequired fields may be absent
(or None); `type` names the record.

A rank's step record is the one that grows: what a step measures is a field
of Step named in WindowedValue or LatestValue, which says how the supervisor
keeps it (in each rank's rolling window of steps, or its latest value). A new
per-step metric is that field, the line in the trainer that measures it, and
a row of the metric table (model/metrics.py) where it shows.

Past the codec every consumer takes these types (Record, or the one its
handler is for): mypy checks each field it reads. Each is final, so that mypy
narrows a Record by the fields it has (`"rank" in record`) as by its type.

Only the standard library here: every training rank imports the wire.
"""

import sys
from typing import Any, Literal, final, get_args

# NotRequired is re-exported: schemas.py reads it off the definitions' hints.
if sys.version_info >= (3, 11):
    from typing import NotRequired as NotRequired
    from typing import TypedDict
else:  # pragma: no cover - Python 3.10's TypedDict does not know NotRequired
    from typing_extensions import NotRequired as NotRequired
    from typing_extensions import TypedDict


WindowedValue = Literal["data_ms", "samples", "tokens", "comm_ms", "comm_overlap_ms", "comm_bytes", "compute_ms"]
"""What a step measures that the supervisor keeps in each rank's rolling window of steps, for
means, rates and percentiles."""
LatestValue = Literal["loss", "grad_norm", "shard_norm", "lr", "mem_alloc", "mem_reserved", "mem_peak"]
"""What a step measures that the supervisor keeps as the rank's last value: a step without it
leaves the last one standing."""
WINDOWED: tuple[WindowedValue, ...] = get_args(WindowedValue)
LATEST: tuple[LatestValue, ...] = get_args(LatestValue)


@final
class Step(TypedDict):
    """One training step of one rank, built by the trainer's step tracker (trainer/steps.py).
    Each value it measured is WINDOWED or LATEST: how the supervisor keeps it."""

    type: Literal["step"]
    rank: int
    step: int
    wall: float
    step_ms: float
    data_ms: NotRequired[float]
    """Waiting for data: from the previous step's end to this one's first forward, less an evaluation (eval_ms)."""
    samples: NotRequired[int]
    """The forward inputs' batch dimension, summed over the step's forwards."""
    tokens: NotRequired[int]
    """Elements of the forwards' token ids (a 2-D integer input)."""
    comm_ms: NotRequired[float]
    """Sampled: DDP's gradient all-reduces, from the first bucket's launch to the last's end (comm_step);
    of a sharded job, its collectives in the step, added up (trainer/collective_timer.py)."""
    comm_dims: NotRequired[dict[str, Any]]
    """Sampled, of a sharded job: comm_ms per mesh dimension, per op, in ms
    ({"shard": {"all-gather": 3.1, "reduce-scatter": 1.2}, "replicate": {"all-reduce": 0.4}})."""
    comm_overlap_ms: NotRequired[float]
    """Sampled: how much of comm_ms ran beside the backward's compute (comm_step)."""
    comm_bytes: NotRequired[int]
    """Sampled: bytes DDP's gradient buckets all-reduce in a step (comm_step)."""
    compute_ms: NotRequired[float]
    """Sampled: DDP's forward and backward compute, without the all-reduce's wait (comm_step); times
    the step's micro-batches where it accumulated gradients (DDP times the synced one alone). Of
    a sharded job, the step less its data wait and its wait in its collectives."""
    loss: NotRequired[float]
    """What backward() was called on, summed over the step, or what monitor.step() said."""
    grad_norm: NotRequired[float]
    """The global gradient norm before clipping, unscaled."""
    shard_norm: NotRequired[float]
    """Of sharded gradients (DTensors) whose global norm the step did not take: the norm of this
    rank's own pieces of them, unscaled."""
    grad_sq_share: NotRequired[float]
    """With shard_norm: this rank's share of the squared global norm, each piece weighed by one
    over the ranks that hold it (trainer/shard_share.py); the ranks' shares of a step add up to it."""
    lr: NotRequired[float]
    """The learning rate of the optimizer's first parameter group, as the step used it."""
    mem_alloc: NotRequired[int]
    """GPU bytes allocated by the rank's tensors."""
    mem_reserved: NotRequired[int]
    """GPU bytes the caching allocator holds."""
    mem_peak: NotRequired[int]
    """The allocator's peak of allocated bytes."""
    total_steps: NotRequired[int]
    eval_ms: NotRequired[float]
    """An evaluation between the step before and this one's first forward (DDP forwards that were
    not training), from its first forward to its last's return: no part of data_ms."""
    eval_ended: NotRequired[float]
    """When that evaluation's last forward returned, Unix time: every rank's rates leave its span out."""
    comm_step: NotRequired[int]
    """The step the sampled comm values measured (trainer/sampled.py): DDP times its
    iterations 1-10, then about one a second (every 100th at most), and a record carries a
    sampling once, when the rank has read it (about once a second), so this is the record's
    step or an earlier one."""
    nonfinite: NotRequired[bool]
    """The in-rank watchdog (trainer/guard.py): the reduced gradients held a NaN/Inf."""
    local_nonfinite: NotRequired[bool]
    """It came from this rank: its own loss was non-finite (or it trains alone). False: its
    loss was finite; absent: it had none to tell."""
    skipped: NotRequired[str]
    """"nan": the guard skipped the step; "scaler": a GradScaler did."""
    sharded: NotRequired[bool]
    """The gradients were sharded over ranks (DTensors: FSDP2, HSDP, tensor parallelism; FSDP1's
    flat shards): the ranks meet in all-gathers and reduce-scatters, not DDP's all-reduce. A
    non-finite step was skipped only off a global norm (the script's clip, --clip-grad's), which
    every rank reads alike; otherwise applied, whatever --on-nan says: a rank that skipped alone
    would hold shards a step apart."""
    clipped: NotRequired[bool]
    """Sent whenever --clip-grad is on: whether the step was clipped."""
    checksum: NotRequired[int]
    """The parameters' checksum, every --desync-every steps."""
    replicas: NotRequired[list[Any]]
    """With checksum, where the rank is data-parallel with part of the job (Heartbeat replicas):
    those ranks, whose checksums this one is compared with. Absent: every rank's."""


@final
class RankHello(TypedDict):
    """A rank introduces itself once per connection."""

    type: Literal["rank_hello"]
    rank: int
    local_rank: int
    world_size: int
    node: int
    host: str
    pid: int
    restart: int
    started: NotRequired[float]


@final
class Heartbeat(TypedDict):
    """About once a second: liveness and where the rank is."""

    type: Literal["heartbeat"]
    rank: int
    wall: float
    phase: str
    where: NotRequired[str]
    """The main thread's innermost frame of the script's code, "train.py:51 in train_step" (trainer/where.py)."""
    inside: NotRequired[str]
    """The torch.distributed call the main thread is in ("all_reduce", "barrier")."""
    stack: NotRequired[list[Any]]
    """The main thread's frames, outermost first (core/places.py stack_line); only when they changed since the rank's previous heartbeat."""
    step: int
    """The step in progress: the rank has finished every step before it."""
    forwards: NotRequired[int]
    """The DDP model's forwards so far, evaluation's included."""
    gpu_uuid: NotRequired[str]
    """The UUID of the GPU the rank trains on ("GPU-..." as NVML writes it), once it uses one:
    NVML lists a container's processes by the host's pids, so the supervisor finds the rank's
    GPU memory by its GPU (supervisor/sampler.py)."""
    replicas: NotRequired[list[Any]]
    """Where the rank is data-parallel with part of the job (DDP over a pipeline stage's or a
    tensor-parallel shard's replicas, FSDP over one dimension of a mesh): those ranks. They do
    its work on other samples; the other stages or shards saw the same samples, which the job
    counts once."""
    batch_shared: NotRequired[int]
    """Where tensor parallelism alone splits the model over the whole job: how many ranks are
    given the rank's batch (its tensor-parallel group), which the job counts once."""
    collectives: NotRequired[list["Collective"]]
    """Collective, one per process group the rank is in: the last collective it entered and
    completed there, from torch's flight recorder; only from a rank that has sat on one step a
    while (trainer/flightrecorder.py)."""
    dropped: int


@final
class RankNote(TypedDict):
    """What a rank's instrumentation wants the user to know, once (how a NaN step is handled on its optimizer)."""

    type: Literal["rank_note"]
    rank: int
    wall: float
    text: str


@final
class Phase(TypedDict):
    """A rank's start-up, step by step: torch imported ("torch"), its process group joined ("group")."""

    type: Literal["phase"]
    rank: int
    wall: float
    phase: str


@final
class AgentHello(TypedDict):
    """torchrun's own agent, through ddptop's probe (supervisor/launching/torchrun_probe.py)."""

    type: Literal["agent_hello"]
    node: int


@final
class AgentPhase(TypedDict):
    """A step of starting the workers of attempt `restart` that only the agent sees: the old workers "stopped", the "rendezvous" done, the new workers "started"."""

    type: Literal["agent_phase"]
    node: int
    restart: int
    phase: str
    wall: float


@final
class AgentNote(TypedDict):
    """What the user should know of how the agent starts workers (the template's fallback)."""

    type: Literal["agent_note"]
    node: int
    wall: float
    text: str


@final
class WorkerFailure(TypedDict):
    """A worker process ended with a failure: what only torchrun knows. restart: the job's attempt it ran in (the probe's count, the same on every node)."""

    type: Literal["worker_failure"]
    node: int
    restart: int
    rank: int
    local_rank: int
    pid: int
    exitcode: int
    wall: float
    message: NotRequired[str]
    oom_kills: NotRequired[int]
    """Processes of the node's job (ranks, their DataLoader workers) the kernel's OOM killer killed
    in the attempt, as torchrun's memory cgroup counts them; absent when none, or not counted."""


@final
class GroupRestart(TypedDict):
    """torchrun restarts its worker group (restart counts from 1), after backoff_s, because rank failed with exitcode (torchrun's view: the first it saw)."""

    type: Literal["group_restart"]
    node: int
    restart: int
    remaining: int
    wall: float
    backoff_s: NotRequired[float]
    rank: NotRequired[int]
    exitcode: NotRequired[int]
    ordered: NotRequired[str]
    """The watchdog verdict (its kind) for which ddptop stopped the group itself: then rank and
    exitcode are only the first of the ranks ddptop killed, no cause (added by the supervisor)."""
    asked: NotRequired[str]
    """The user's request for which ddptop stopped the group, in words ("kill of rank 1 requested
    from the shell (ddptop kill)"): then, too, rank and exitcode name only whom ddptop killed, and
    the restart waits out no backoff (added by the supervisor)."""


@final
class RestartGo(TypedDict):
    """The supervisor to torchrun's probe: it has judged the failure behind restart number `restart` and not stopped the job, so the restart may go ahead."""

    type: Literal["restart_go"]
    restart: int
    now: NotRequired[bool]
    """Go without waiting out the rest of the backoff: a restart the user asked for."""


@final
class Checkpoint(TypedDict):
    """monitor.checkpoint() wrote a checkpoint (rank 0) / monitor.resume() loaded one."""

    type: Literal["checkpoint"]
    rank: int
    wall: float
    step: int
    path: str
    bytes: int
    write_ms: float


@final
class Resume(TypedDict):
    """A rank goes on from a checkpoint after `step`: monitor.resume() loaded `path` (skipping
    the `damaged` ones), or the script restored its own optimizer state (optimizer_step.RESUMED_FROM)."""

    type: Literal["resume"]
    rank: int
    wall: float
    step: int
    path: str
    damaged: list[Any]


@final
class Uncaught(TypedDict):
    """The traceback of an exception the script did not catch (its end)."""

    type: Literal["exception"]
    rank: int
    wall: float
    text: str
    phase: NotRequired[str]
    """Where in its step the rank was when it raised (Heartbeat.phase): its heartbeats say
    "exit" from then on, as the interpreter shuts down."""


@final
class Batch(TypedDict):
    """A rank's records, sent together so the socket sees a few frames a second."""

    type: Literal["batch"]
    items: list[Any]


@final
class ViewerHello(TypedDict):
    """A dashboard introduces itself; with history, it first gets the run so far. history: the run's records so far first; snapshot: the job's state as a few frames instead (model/snapshot.py), what a dashboard asks for."""

    type: Literal["viewer_hello"]
    history: NotRequired[bool]
    snapshot: NotRequired[bool]


CommandAction = Literal["stop", "restart", "kill_rank", "stacks", "log_tail", "profile"]
"""What a viewer may ask of a supervisor: stop the job, restart the group, kill one rank,
profile ranks, dump a rank's stacks now; and what the aggregator asks of a node's supervisor:
collect stacks, read a rank's log's end, start a capture on its ranks."""


@final
class Command(TypedDict):
    """What a dashboard may ask of the supervisor, and the job's aggregator of a node's supervisor (stacks: collect those ranks' Python stacks)."""

    type: Literal["command"]
    action: CommandAction
    rank: NotRequired[int]
    ranks: NotRequired[list[int]]
    origin: NotRequired[str]
    steps: NotRequired[int]
    """profile: the steps to capture."""
    id: NotRequired[str]
    """profile, from the aggregator to a node: the capture's id."""
    from_step: NotRequired[int]
    """profile, from the aggregator to a node: the step the capture starts at."""


def asked_ranks(command: "Command", default: list[int]) -> list[int]:
    """The ranks a command names: its ranks, else its one rank, else default (a command of
    every rank, or of none)."""
    if command.get("ranks"):
        return list(command["ranks"])
    return [command["rank"]] if "rank" in command and command["rank"] is not None else default


@final
class RankCommand(TypedDict):
    """The supervisor to one rank, over the rank's own connection (trainer/sender.py reads it)."""

    type: Literal["rank_command"]
    action: str
    """profile: capture `steps` steps from step from_step on (or the next step, if past it)."""
    id: str
    steps: int
    from_step: NotRequired[int]
    """The same for every rank asked, far enough ahead for each to hear of it first: ranks captured together capture the same steps."""
    folder: str
    """Where the rank writes its trace: the run directory's profiles/ on its own node."""


@final
class Profile(TypedDict):
    """A rank's capture (trainer/profiling.py), or why it has none (error)."""

    type: Literal["profile"]
    rank: int
    wall: float
    id: str
    first_step: int
    steps: int
    path: NotRequired[str]
    """The trace, gzipped Chrome trace JSON: Perfetto and chrome://tracing open it."""
    error: NotRequired[str]
    cuda: NotRequired[bool]
    phases: NotRequired[dict[str, Any]]
    """Each phase's mean ms a step: data, forward, backward, comm, overlap (comm beside compute), optimizer."""
    ops: NotRequired[list[Any]]
    """The top ops by self time: [name, self CPU ms, self CUDA ms, calls], a step's mean."""


@final
class Capture(TypedDict):
    """The supervisor on a capture asked for: started on ranks, refused (text says why), or done."""

    type: Literal["capture"]
    wall: float
    id: str
    state: str
    text: str
    ranks: NotRequired[list[Any]]
    steps: NotRequired[int]


@final
class Auth(TypedDict):
    """Over TCP, the first frame of every connection: the run's token."""

    type: Literal["auth"]
    token: str


@final
class NodeHello(TypedDict):
    """A node's supervisor joins the job's aggregator (node 0's supervisor), which answers node_welcome, or refused and closes; then the node forwards records."""

    type: Literal["node_hello"]
    node: int
    nnodes: int
    host: str
    pid: int


@final
class NodeWelcome(TypedDict):
    """The aggregator takes a node in: the job's run id, for the node's own run directory."""

    type: Literal["node_welcome"]
    node: int
    run: str


@final
class Refused(TypedDict):
    """The aggregator turns a node away (a bad token, a node number taken), and why."""

    type: Literal["refused"]
    reason: str


@final
class RankGone(TypedDict):
    """A rank's connection closed: the first of the records a supervisor makes, which a node forwards to the aggregator."""

    type: Literal["rank_gone"]
    rank: int
    wall: float


@final
class Sample(TypedDict):
    """One node's rank processes and GPUs, read by its supervisor (SampleProc, SampleGpu)."""

    type: Literal["sample"]
    wall: float
    procs: list["SampleProc"]
    gpus: list["SampleGpu"]
    node: NotRequired[int]


@final
class Stack(TypedDict):
    """A rank's stacks, as `source` (py-spy, faulthandler) dumped them: a stuck rank's, or one a dashboard asked for."""

    type: Literal["stack"]
    rank: int
    wall: float
    source: str
    text: str


@final
class LogTail(TypedDict):
    """The end of a rank's own log (its attempt's stdout and stderr), read on its node at a dashboard's asking (command log_tail): sent to the dashboards, not kept in the event log."""

    type: Literal["log_tail"]
    rank: int
    wall: float
    restart: int
    lines: list[Any]


@final
class Action(TypedDict):
    """What the supervisor did (a restart, a stop, a rank killed), in words."""

    type: Literal["action"]
    wall: float
    text: str
    rank: NotRequired[int]
    node: NotRequired[int]
    kind: NotRequired[str]
    """What a reader acts on, where one does: NO_STACKS."""


@final
class Notice(TypedDict):
    """What the supervisor wants the user to know that is no alert (its own trouble, a pause)."""

    type: Literal["notice"]
    wall: float
    text: str
    node: NotRequired[int]
    kind: NotRequired[str]
    """The watchdog verdict it tells of ("pause", "world-size", "no-ranks"): goodput counts a pause's time apart from stalls."""


@final
class WireError(TypedDict):
    """A frame refused from a peer, and why; its connection is closed."""

    type: Literal["wire_error"]
    wall: float
    error: str
    rank: NotRequired[int]
    node: NotRequired[int]


@final
class Run(TypedDict):
    """What the supervisor makes itself. The run record opens every event log: the launch's metadata (meta.json as it was at the start)."""

    type: Literal["run"]
    wall: float
    id: str
    script: str
    args: NotRequired[list[Any]]
    nproc_per_node: NotRequired[int]
    launch_style: NotRequired[str]
    launch_reason: NotRequired[str]
    port_set_at: NotRequired[str]
    gpus: NotRequired[int]
    nnodes: NotRequired[str]
    node_rank: NotRequired[int]
    listen: NotRequired[str]
    aggregator: NotRequired[str]
    prometheus: NotRequired[str]
    host: NotRequired[str]
    cpu_only: NotRequired[bool]
    address: NotRequired[str]
    started: NotRequired[float]
    supervisor_pid: NotRequired[int]
    supervisor_started: NotRequired[float]
    state: NotRequired[str]
    version: NotRequired[str]


@final
class Alert(TypedDict):
    """A watchdog verdict; the fields after action are the kind's own details."""

    type: Literal["alert"]
    wall: float
    kind: str
    text: str
    action: str
    ranks: list[Any]
    rank: NotRequired[int]
    step: NotRequired[int]
    checksums: NotRequired[dict[str, Any]]
    ratio: NotRequired[float]
    cause: NotRequired[str]
    """straggler: "input" (its data wait) or "compute", whichever sets it apart (model/lag.py)."""
    window_s: NotRequired[float]
    """stall: the window no step came in, seconds (rules/stall.py)."""
    exitcode: NotRequired[int]
    exit_status: NotRequired[int]
    log: NotRequired[list[Any]]
    traceback: NotRequired[str]


@final
class Summary(TypedDict):
    """The job's totals, once a second (model/totals.py); metrics: the metric table's job figures by key, so a new metric needs no schema of its own."""

    type: Literal["summary"]
    wall: float
    steps_done: NotRequired[int]
    total_steps: NotRequired[int]
    ranks_seen: int
    world_size: int
    busbw: NotRequired[float]
    """The all-reduce's bus bandwidth as ddptop wrote it before it was a row of the metric table
    (now metrics["busbw"]): read in the event logs of those runs, written no more."""
    dropped: int
    alerts: int
    nan_skips: int
    scaler_skips: int
    clip_rate: NotRequired[float]
    restarts: int
    checkpoint_step: NotRequired[int]
    metrics: dict[str, Any]
    rank_step_ms: NotRequired[bytes]
    """Each rank's mean step and comm ms since the last summary, and its own work per step now
    (model/lag.py), float32 by rank, NaN where none (model/history.py): the charts' per-rank lines."""
    rank_own_ms: NotRequired[bytes]
    rank_comm_ms: NotRequired[bytes]
    own_counts_compute: NotRequired[bool]
    """Whether rank_own_ms counts each rank's compute beside its data wait (model/lag.py): it
    starts to once DDP has timed every rank's compute, and the ranks' chart marks when."""


@final
class Exit(TypedDict):
    """The job is over: torchrun's exit status, or 128+N when stopped by signal N."""

    type: Literal["exit"]
    wall: float
    code: int
    stopped_by_signal: NotRequired[int]
    goodput: NotRequired[dict[str, Any] | None]


OUTSIDE = "outside"
"""The launch_style of a job ddptop did not launch, watched from outside (supervisor/outside/watch.py):
its ranks send no steps, so a dashboard gives the room of the charts to its ranks."""

NO_STACKS = "no-stacks"
"""An action's kind where a rank gave no stack dump: `ddptop stacks` takes it as that rank's answer."""

WORLD_DIMENSION = "world"
"""Step comm_dims' name for the collectives of the default group, every rank's: a 1-D mesh
over the whole job is that group."""

DEFAULT_GROUP = "0"
"""The flight recorder's id of a process's first group, the default one, which every rank is in:
ids count the groups a process made, in the order every rank makes them (torch requires it)."""


@final
class Collective(TypedDict):
    """Where a rank stands in one process group's collectives: sequence numbers count the
    group's collectives from 1, the same on every rank of the group."""

    group: str
    """The group's id within the job: the flight recorder's (DEFAULT_GROUP for the default group)."""
    name: str
    """What the group is called: "default group", or torch's description of it."""
    enqueued: int
    """The last collective the rank entered (0: none yet)."""
    completed: int
    """The last one it completed."""
    op: NotRequired[str]
    """The last entered one's operation: all_reduce, broadcast, allgather..."""
    bytes: NotRequired[int]
    """Its input's size."""


@final
class SampleProc(TypedDict):
    """One rank process in a sample record."""

    rank: int
    pid: int
    cpu: NotRequired[float]
    rss: NotRequired[int]
    threads: NotRequired[int]
    io: NotRequired[float]
    """Bytes a second it read from and wrote to storage since the last sample (the kernel's
    read_bytes and write_bytes: page-cache misses and pages it dirtied, not pipes or sockets)."""
    gpu: NotRequired[int]
    gpu_mem: NotRequired[int | None]


@final
class SampleGpu(TypedDict):
    """One GPU in a sample record (NVML's figures)."""

    index: int
    name: NotRequired[str]
    util: NotRequired[float | None]
    mem_used: NotRequired[int | None]
    mem_total: NotRequired[int | None]
    temperature: NotRequired[float | None]
    power_w: NotRequired[float | None]


RecordKind = Literal[
    "step",
    "rank_hello",
    "heartbeat",
    "phase",
    "rank_note",
    "rank_command",
    "profile",
    "capture",
    "agent_hello",
    "agent_phase",
    "agent_note",
    "worker_failure",
    "group_restart",
    "restart_go",
    "checkpoint",
    "resume",
    "exception",
    "batch",
    "viewer_hello",
    "command",
    "auth",
    "node_hello",
    "node_welcome",
    "refused",
    "rank_gone",
    "sample",
    "stack",
    "log_tail",
    "action",
    "notice",
    "wire_error",
    "run",
    "alert",
    "summary",
    "exit",
]
"""Every record type's name, as its `type` field carries it: what tables of handlers are keyed by."""


RECORDS: dict[RecordKind, type] = {
    "step": Step,
    "rank_hello": RankHello,
    "heartbeat": Heartbeat,
    "phase": Phase,
    "rank_note": RankNote,
    "rank_command": RankCommand,
    "profile": Profile,
    "capture": Capture,
    "agent_hello": AgentHello,
    "agent_phase": AgentPhase,
    "agent_note": AgentNote,
    "worker_failure": WorkerFailure,
    "group_restart": GroupRestart,
    "restart_go": RestartGo,
    "checkpoint": Checkpoint,
    "resume": Resume,
    "exception": Uncaught,
    "batch": Batch,
    "viewer_hello": ViewerHello,
    "command": Command,
    "auth": Auth,
    "node_hello": NodeHello,
    "node_welcome": NodeWelcome,
    "refused": Refused,
    "rank_gone": RankGone,
    "sample": Sample,
    "stack": Stack,
    "log_tail": LogTail,
    "action": Action,
    "notice": Notice,
    "wire_error": WireError,
    "run": Run,
    "alert": Alert,
    "summary": Summary,
    "exit": Exit,
}
"""Every record type by the name its `type` field carries."""

Record = (
    Step
    | RankHello
    | Heartbeat
    | Phase
    | RankNote
    | RankCommand
    | Profile
    | Capture
    | AgentHello
    | AgentPhase
    | AgentNote
    | WorkerFailure
    | GroupRestart
    | RestartGo
    | Checkpoint
    | Resume
    | Uncaught
    | Batch
    | ViewerHello
    | Command
    | Auth
    | NodeHello
    | NodeWelcome
    | Refused
    | RankGone
    | Sample
    | Stack
    | LogTail
    | Action
    | Notice
    | WireError
    | Run
    | Alert
    | Summary
    | Exit
)
"""Any record, as the codec's check hands it on: its `type` tells which (mypy narrows on it)."""
