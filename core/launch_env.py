"""The launch contract: every environment variable the supervisor and the ranks pass each other.

The supervisor sets them in torchrun's environment (supervisor/launching/torchrun.py);
ddptop's probe inside torchrun, the template that forks the workers, the
bootstrap and the trainer read them. Both sides take the names from here.
Only the standard library: the bootstrap imports this in every process of a job.
"""

ADDRESS = "DDPTOP_ADDRESS"
"""Where the supervisor listens for its ranks (a Unix socket's path); unset outside ddptop."""

RANK_PID = "DDPTOP_RANK_PID"
"""The pid of the process that became the rank: a subprocess it starts inherits it, and is no rank."""

AGENT_PID = "DDPTOP_AGENT_PID"
"""torchrun's pid, set by ddptop's probe inside it: a rank dies with it."""

ATTEMPT = "DDPTOP_ATTEMPT"
"""The job's attempt, counted by the probe the same on every node (torchrun's
TORCHELASTIC_RESTART_COUNT counts this node's failures only)."""

LAUNCH_STYLE = "DDPTOP_LAUNCH_STYLE"
"""torchrun, spawn or single (supervisor/launching/style.py); spawn makes the bootstrap wait for
the script's own ranks (trainer/spawned.py)."""

SPAWNER_PID = "DDPTOP_SPAWNER_PID"
"""The pid of a spawn-style script's first process, which is no rank: its children are."""

TEMPLATE_FD = "DDPTOP_TEMPLATE_FD"
"""The template's end of its channel to torchrun's probe (an inherited descriptor)."""

TEMPLATE_PARENT = "DDPTOP_TEMPLATE_PARENT"
"""torchrun's pid, for the template that forks the workers: it dies with torchrun."""

NO_TEMPLATE = "DDPTOP_NO_TEMPLATE"
"""Set when the workers are not forked from the template (--no-template, or a job it does not
serve): the probe starts every worker the plain way."""

RESTART_BACKOFF = "DDPTOP_RESTART_BACKOFF"
"""Base of the waits between restarts (--restart-backoff), read by the probe."""

STACKS_DIR = "DDPTOP_STACKS_DIR"
"""Where a rank's faulthandler writes its stacks when asked (the run directory's stacks/raw)."""

ON_NAN = "DDPTOP_ON_NAN"
CLIP_GRAD = "DDPTOP_CLIP_GRAD"
DESYNC_EVERY = "DDPTOP_DESYNC_EVERY"
BUCKET_VIEW = "DDPTOP_BUCKET_VIEW"
"""The guard's policy, as `ddptop launch` was given it (core/policy.py GuardPolicy.to_env)."""

TOKEN = "DDPTOP_TOKEN"
"""The run's token for the wire over TCP, which a user may give: the supervisor's secret, kept
out of the ranks' environment."""

INHERITED = (RANK_PID, AGENT_PID, TOKEN, SPAWNER_PID)
"""ddptop's variables a launch must not pass on from the shell it was started in (a `ddptop
launch` run from inside a rank of another job)."""
