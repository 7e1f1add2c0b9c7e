"""Round-trip time from TCP connects: no privileges, no ping binary.

A TCP connect completes after one round trip (SYN out, SYN-ACK back), and the
kernel times that round trip itself: a completed connect's RTT is the kernel's
sample (TCP_INFO's tcpi_rtt), not the host's clock around `connect()`, which
also counts the time the probing thread waited to run. In the agent that thread
shares the GIL with the event loop: at a lab job's start a burst read a 15.7 ms
minimum on a 0.09 ms path, and the model then priced PowerSGD's many messages
at 7.9 ms each. A refused connect (RST back) is a round trip too and counts as
an answer, so the port need not be listening, but the kernel keeps no sample of
it: its RTT is the host's time. No answer within the timeout, or an unreachable
host, counts as a lost sample. A burst of samples is summarised as min / p50 /
p99 / loss.

`netns=NAME` makes the sockets inside that network namespace (through pyroute2),
for the lab and the tests.
"""

from __future__ import annotations

import errno
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from flexcomm.probe.addresses import socket_address, socket_in
from flexcomm.store.records import LATENCY, Measurement

DEFAULT_COUNT = 10
DEFAULT_INTERVAL_S = 0.01
DEFAULT_TIMEOUT_S = 1.0
# struct tcp_info (linux/tcp.h): eight one-byte fields, then 32-bit ones, of
# which tcpi_rtt (smoothed RTT, microseconds) is the sixteenth.
TCPI_RTT_OFFSET = 68


@dataclass(frozen=True)
class RttSummary:
    """A burst of `sent` connects of which `answered` came back. The times are
    None when nothing answered; `error` is the last failure seen."""

    peer: str
    port: int
    sent: int
    answered: int
    min_s: float | None
    p50_s: float | None
    p99_s: float | None
    error: str = ""

    @property
    def loss(self) -> float:
        return 1.0 - self.answered / self.sent


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ascending values, linearly interpolated."""
    if not sorted_values:
        raise ValueError("values: need at least one")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def connect_rtt(family: int, address: tuple, timeout_s: float,
                netns: str | None = None) -> float:
    """Seconds one connect's round trip took (see the module docstring); raises
    OSError when the peer did not answer."""
    with socket_in(netns, family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        start = time.perf_counter()
        try:
            sock.connect(address)
        except ConnectionRefusedError:  # the RST came back: a round trip the kernel did not time
            return time.perf_counter() - start
        host = time.perf_counter() - start
        return kernel_rtt(sock) or host


def kernel_rtt(sock: socket.socket) -> float | None:
    """The kernel's RTT of a connected TCP socket in seconds; None where it has
    none (no sample yet, or no TCP_INFO on this system)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCPI_RTT_OFFSET + 4)
    except (AttributeError, OSError):
        return None
    if len(info) < TCPI_RTT_OFFSET + 4:
        return None
    rtt_us = struct.unpack_from("=I", info, TCPI_RTT_OFFSET)[0]
    return rtt_us / 1e6 if rtt_us else None


def rtt_burst(peer: str, port: int, *, count: int = DEFAULT_COUNT,
              interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S,
              netns: str | None = None) -> RttSummary:
    """`count` connects to peer:port, `interval_s` apart, summarised."""
    if count < 1:
        raise ValueError(f"count: must be >= 1, got {count!r}")
    family, address = socket_address(peer, port, socket.SOCK_STREAM)
    samples: list[float] = []
    error = ""
    for i in range(count):
        if i:
            time.sleep(interval_s)
        try:
            samples.append(connect_rtt(family, address, timeout_s, netns))
        except TimeoutError:
            error = f"no answer within {timeout_s:g} s"
        except OSError as exc:
            error = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    samples.sort()
    if not samples:
        return RttSummary(peer, port, count, 0, None, None, None, error)
    return RttSummary(peer, port, count, len(samples), samples[0], percentile(samples, 50),
                      percentile(samples, 99), error)


def latency_measurement(summary: RttSummary) -> Measurement:
    """The store's record of a burst. alpha is half the smallest RTT (one way):
    the median rises with queueing behind a busy link (a training job saturating
    it doubled the median here), and the alpha of the cost model is the path's
    latency, not its queue. A burst with no answer at all is a failed measurement."""
    if summary.answered == 0:
        return Measurement(peer=summary.peer, kind=LATENCY, ok=False, loss=1.0,
                           error=f"tcp connect to {summary.peer}:{summary.port}: {summary.error}")
    assert summary.min_s is not None
    return Measurement(peer=summary.peer, kind=LATENCY, rtt_min_s=summary.min_s,
                       rtt_p50_s=summary.p50_s, rtt_p99_s=summary.p99_s, loss=summary.loss,
                       alpha_s=summary.min_s / 2)
