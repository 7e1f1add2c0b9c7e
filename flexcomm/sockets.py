"""Whether something is listening on a Unix socket (the agent's, typically), and
whether a TCP listener could start."""

from __future__ import annotations

import os
import socket


def unix_socket_listening(path: str | os.PathLike[str]) -> bool:
    """True when a connect to `path` succeeds: a live server, not a stale file."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(os.fspath(path))
        except OSError:
            return False
    return True


def tcp_listen_error(host: str, port: int) -> str | None:
    """Why a TCP listener on host:port cannot start here (the port is in use, the
    address is not this host's), or None when it can."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        return exc.strerror
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
        try:
            s.bind(address)
        except OSError as exc:
            return exc.strerror
    return None
