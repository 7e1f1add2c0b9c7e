"""Whether something is listening on a Unix socket (the agent's, typically)."""

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
