"""How faithfully an emulated link carries traffic: two measurements over real sockets.

- `message_seconds(sender, receiver, size)`: the median time to send `size` bytes
  over an idle link and get one byte back, the way a compressed collective sends
  its first message. Against `size * 8 / rate` it shows the burst the shaper lets
  through after idle.
- `goodput_share(goodput_bps, rate_bps)`: iperf3's goodput as a share of the most
  TCP can carry over a link shaped to `rate_bps` at MTU 1500, so 1.0 means the
  shaper passes exactly its rate (HTB counts frames, iperf3 only payload).

`bench/shaper_fidelity.py` reports both per rate; the shaping tests assert them.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Protocol

from flexcomm.emulation.record import TCP_PAYLOAD_SHARE

MESSAGE_PORT = 47002
IDLE_BEFORE_MESSAGE_S = 0.2  # longer than any bucket takes to refill


class Host(Protocol):
    """An emulated host: `flexcomm.lab.netns.Node` or `flexcomm.lab.cluster.LabNode`."""

    address: str

    def argv(self, cmd: Sequence[str]) -> list[str]: ...


_SEND_AND_TIME = """
import socket, sys, time
host, port, size, repeats, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
for _ in range(100):
    try:
        s = socket.create_connection((host, port), timeout=5); break
    except OSError: time.sleep(0.05)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
payload = bytes(size)
for _ in range(repeats):
    time.sleep(idle)
    t0 = time.perf_counter(); s.sendall(payload); s.recv(1)
    print(time.perf_counter() - t0)
"""
_RECEIVE_AND_ACK = """
import socket, sys
host, port, size, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind((host, port)); l.listen()
c, _ = l.accept()
for _ in range(repeats):
    got = 0
    while got < size:
        got += len(c.recv(size - got))
    c.sendall(b"k")
"""


def message_seconds(sender: Host, receiver: Host, size: int, *, repeats: int = 5,
                    port: int = MESSAGE_PORT) -> float:
    """Median seconds for `size` bytes from `sender` to `receiver` after idle, plus
    one byte back. Raises RuntimeError with the receiver's stderr if it fails."""
    if size < 1 or repeats < 1:
        raise ValueError(f"size and repeats: must be >= 1, got {size!r} and {repeats!r}")
    args = [receiver.address, str(port), str(size), str(repeats)]
    listener = subprocess.Popen(receiver.argv([sys.executable, "-c", _RECEIVE_AND_ACK, *args]),
                                stderr=subprocess.PIPE, text=True)
    try:
        sender_cmd = [sys.executable, "-c", _SEND_AND_TIME, *args, str(IDLE_BEFORE_MESSAGE_S)]
        done = subprocess.run(sender.argv(sender_cmd), capture_output=True, text=True,
                              timeout=30 + repeats * 2)
        listener.wait(10)
    finally:
        if listener.poll() is None:
            listener.kill()
        _, listener_err = listener.communicate()
    if done.returncode != 0 or listener.returncode != 0:
        raise RuntimeError(f"timing a {size}-byte message failed: {done.stderr.strip()} "
                           f"{listener_err.strip()}".strip())
    return statistics.median(float(line) for line in done.stdout.split())


def goodput_share(goodput_bps: float, rate_bps: float) -> float:
    """`goodput_bps` as a share of the most TCP carries over a link shaped to `rate_bps`."""
    return goodput_bps / (rate_bps * TCP_PAYLOAD_SHARE)
