"""`ddptop attach HOST:PORT[,HOST:PORT...]`: which supervisor, with which token.

Each address is asked for its run (auth, then viewer_hello: the run record
is in the first frames of its history) before the dashboard opens, so a
wrong token, a refusal or nobody listening is one line and exit 2. Of
several answering supervisors of one job, node 0's shows every node's ranks
(it aggregates them): it is the one the dashboard attaches to.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptop.core import launch_env, rundir, wire
from ddptop.core.rundir import RunDirError
from ddptop.core.wire.stream import socket_frames
from ddptop.supervisor.cluster import endpoints

PROBE_S = 5.0
_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^/:\[\],]+):\d+$")


def is_address_list(spec: str) -> bool:
    """HOST:PORT[,HOST:PORT...], as opposed to a run id or a path."""
    return not Path(spec).exists() and all(_ADDRESS.match(part) for part in spec.split(","))


@dataclass
class Target:
    host: str
    port: int
    token: str
    meta: dict[str, Any]

    @property
    def aggregates(self) -> bool:
        return self.meta.get("node_rank") == 0 and not rundir.single_node(self.meta)


def local_token(address: str) -> str | None:
    """The token of this user's own running run that listens at address, if any."""
    for run in rundir.all_runs():
        try:
            meta = run.read_meta()
        except (OSError, ValueError):
            continue
        if address in (meta.get("listen"), meta.get("aggregator")) and run.token_path.exists():
            return endpoints.read_token(run.token_path)
    return None


def _connect(host: str, port: int) -> socket.socket:
    try:
        return socket.create_connection((host, port), timeout=PROBE_S)
    except OSError as exc:
        raise RunDirError(f"no supervisor answers at {endpoints.text(host, port)} ({exc.strerror or exc})") from None


def probe(host: str, port: int, token: str) -> dict[str, Any]:
    """The run record of the supervisor at host:port, or RunDirError saying why not."""
    where = endpoints.text(host, port)
    sock = _connect(host, port)
    deadline = time.monotonic() + PROBE_S
    try:
        sock.sendall(wire.encode({"type": "auth", "token": token}) + wire.encode({"type": "viewer_hello", "history": True}))
        for frame in socket_frames(sock, deadline):
            if frame["type"] == "refused":
                raise RunDirError(f"the supervisor at {where} refused: {frame.get('reason')}")
            if frame["type"] == "run":
                return frame
    except (OSError, wire.FrameError) as exc:
        raise RunDirError(f"the supervisor at {where} did not answer ({exc})") from None
    finally:
        sock.close()
    raise RunDirError(f"the supervisor at {where} sent no run record within {PROBE_S:.0f} s")


def choose(spec: str, token_file: Path | None) -> tuple[Target, str | None]:
    """The supervisor to attach to, and a notice when it shows part of the job only."""
    given = endpoints.given_token(token_file)
    targets = []
    for part in spec.split(","):
        host, port = endpoints.parse(part, what="address")
        address = endpoints.text(host, port)
        token = given or local_token(address)
        if token is None:
            _connect(host, port).close()  # nobody there is the first thing to say
            raise RunDirError(
                f"{address} needs the run's token: set {launch_env.TOKEN} or give --token-file "
                "(it is the run directory's token file on that machine)"
            )
        targets.append(Target(host, port, token, probe(host, port, token)))
    for target in targets:
        if target.aggregates:
            return target, None
    first = targets[0]
    if rundir.single_node(first.meta):
        return first, None
    return first, f"none of {spec} is node 0's supervisor: showing node {first.meta.get('node_rank')}'s ranks only"
