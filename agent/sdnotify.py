"""systemd's notify protocol: one datagram per state change to $NOTIFY_SOCKET.

Without $NOTIFY_SOCKET (not started by systemd with Type=notify) every call is a
no-op. An address starting with "@" is in the abstract namespace.
"""

from __future__ import annotations

import os
import socket


def notify(state: str, environ: dict[str, str] | None = None) -> bool:
    """Send e.g. "READY=1" or "WATCHDOG=1"; True if a datagram was sent. Never
    waits: when the receiver's queue is full (it holds net.unix.max_dgram_qlen
    datagrams, 10 by default) the datagram is dropped, since the agent's event
    loop sends these and must not stop serving for a reader that is slow."""
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
        try:
            sock.connect(address)
            sock.sendall(state.encode())
        except BlockingIOError:
            return False
    return True


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """Half of $WATCHDOG_USEC in seconds (systemd's advice), or None when unset or
    meant for another process ($WATCHDOG_PID)."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6
