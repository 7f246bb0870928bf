"""TCP endpoints: `[ADDR:]PORT` options, listening sockets, the run's token.

The wire over TCP (remote attach, the other nodes of a job) needs the run's
token, and every listener is bound here, before the job starts (and before
`launch` forks off the supervisor): an address that cannot be bound is bad
input, reported in one line with nothing left running.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

from ddptop.core import launch_env
from ddptop.core.usage import UsageError

LOOPBACK = "127.0.0.1"
BACKLOG = 64


def parse(spec: str, default_host: str = LOOPBACK, what: str = "address") -> tuple[str, int]:
    """`PORT`, `HOST:PORT` or `[V6]:PORT` -> (host, port)."""
    host, sep, port_text = spec.rpartition(":")
    if not sep:
        host = default_host
    host = host.strip("[]") or default_host
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"{what} {spec!r} is not [ADDR:]PORT") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"{what} {spec!r}: port {port} is out of range")
    return host, port


def text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(host: str, port: int, what: str) -> socket.socket:
    """A listening TCP socket, or UsageError saying why not, in one line."""
    try:
        return socket.create_server((host, port), family=_family(host), backlog=BACKLOG)
    except OSError as exc:
        raise UsageError(f"cannot listen on {text(host, port)} for {what}: {exc.strerror or exc}") from None


def check_bindable(host: str, port: int, what: str) -> None:
    """Bind and release: for a listener another library opens later (Prometheus)."""
    listen(host, port, what).close()


def resolve(host: str, what: str) -> None:
    """UsageError, in one line, where host does not resolve here: a rendezvous host mistyped
    would leave torchrun retrying its name for many minutes, saying only c10d's warnings."""
    _family(host, f"{what}: ")


def _family(host: str, said: str = "") -> socket.AddressFamily:
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][0]
    except socket.gaierror as exc:
        raise UsageError(f"{said}cannot resolve {host!r}: {exc.strerror}") from None


def new_token() -> str:
    return secrets.token_urlsafe(24)


def write_token(path: Path, token: str) -> None:
    """The token file, readable by its user only (0600) from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read the token file {path}: {exc.strerror}") from None
    if not token:
        raise UsageError(f"the token file {path} is empty")
    return token


def given_token(token_file: Path | None) -> str | None:
    """The token the user passed: --token-file, else $DDPTOP_TOKEN, else None."""
    if token_file is not None:
        return read_token(token_file)
    return os.environ.get(launch_env.TOKEN) or None
