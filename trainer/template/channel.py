"""The template's channel to torchrun's probe: one message per packet.

A Unix SOCK_SEQPACKET pair keeps message boundaries, and a request carries
the rank's stdin, stdout and stderr as descriptors (SCM_RIGHTS): the log
files torchrun opened for it are the very files the forked rank writes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

import msgpack

MAX_MESSAGE = 1 << 20
MAX_FDS = 3

Message = dict[str, Any]


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(sock: socket.socket, message: Message, fds: Sequence[int] = ()) -> None:
    data = msgpack.packb(message)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def receive(sock: socket.socket) -> tuple[Message, list[int]] | None:
    """The next message and the descriptors that came with it; None once the peer is gone."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return msgpack.unpackb(data), fds
