"""A look by packet train: how fast a burst of UDP datagrams crosses the path,
timed by the receiving kernel.

The sender hands the whole train to the kernel in one call (sendmmsg), so it
leaves back to back and queues at the path's bottleneck, which spaces it out at
its rate. The peer's `TrainServer` reads each datagram's kernel receive
timestamp (SO_TIMESTAMPNS) and sends the stamps back in one datagram; the
sender reads the rate from their spacing (`train_rate`).

Why not a short iperf3 test: its figure is timed by processes, and on a busy
host a starved one reads a fast path at a fraction of its rate (64 KB tests
through the lab's HTB links read 0.08-0.74x at 160-980 Mbit/s beside a test
suite); the receiving kernel's stamps are not delayed so. A sender descheduled
part-way through its call spaces one part of the train out, and a shaper's
timer that fired late lets the credit it saved pass in a clump after the gap:
the rate is the median of the train's sevenths, each timed from the last
arrival before it, so a gap and its clump move at most two of them.

    server = TrainServer(5202, bind="10.0.0.2").start()   # on the peer
    m = train_look("10.0.0.2", 5202, 256 << 10)            # a LOOK measurement

Both ends need no privileges. `netns=NAME` makes the socket inside that network
namespace (through pyroute2), for the lab and the tests.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import math
import os
import secrets
import select
import socket
import statistics
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from flexcomm.probe.addresses import socket_address, socket_in
from flexcomm.store.records import LOOK, Measurement

log = logging.getLogger("flexcomm.probe.train")

DEFAULT_LOOK_PORT = 5202  # UDP
# Every datagram's payload: under the MTU of any path of 1500 (IPv4 or IPv6), so
# nothing is fragmented on the way.
DATAGRAM_BYTES = 1400
MAX_DATAGRAMS = 200  # the stamps of this many fit one reply datagram
MIN_DATAGRAMS = 12
# Beside the test suite the shaper's timer ran 1.4-16 ms late in 27 of 1,449
# trains of 45 datagrams through a 100 Mbit/s HTB link, and the credit it saved
# crossed in a clump after the gap; the clump and a train's opening burst
# compressed two of three thirds: 3 of 1,474 looks read 1.25-2.46x. Sevenths,
# each timed from the arrival before it, read the same trains 1.14-1.24x (the
# ceil's 1.167), and quiet 980 Mbit/s trains 0.82-1.20x where thirds read
# 0.86-1.33x.
SEGMENTS = 7
# A train the server heard nothing of for this long is answered with what came.
TRAIN_IDLE_S = 0.2
MAX_TRAINS = 64  # trains the server holds at once (oldest answered first)
MAX_NAMED = 100  # senders of stray datagrams named in the log (all are counted)
_HEADER = struct.Struct("!4sQHH")  # magic, train id, seq, count
_REPLY = struct.Struct("!4sQH")  # magic, train id, stamps
_STAMP = struct.Struct("!HI")  # seq, ns after the first datagram's arrival
_TRAIN_MAGIC = b"FCT1"
_REPLY_MAGIC = b"FCR1"
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ll")
_BUFFER_BYTES = 4 << 20


class TrainLookError(Exception):
    """A look that read nothing: no answer, too few datagrams back, a refused port."""


def train_rate(stamps: Sequence[tuple[int, int]], datagram_bytes: int = DATAGRAM_BYTES) -> float:
    """Bytes/s of payload a train crossed at, from (seq, arrival ns) of the
    datagrams that arrived: the median of its SEGMENTS parts' rates, each the
    bytes of a part's datagrams over the time from the arrival before its first
    (the train's first for the first part) to its last, so every gap between
    arrivals is timed in one part."""
    ordered = sorted(stamps)
    if len(ordered) < MIN_DATAGRAMS:
        raise TrainLookError(f"only {len(ordered)} datagrams of the train arrived (need {MIN_DATAGRAMS})")
    size = math.ceil(len(ordered) / SEGMENTS)
    rates = []
    for start in range(0, len(ordered), size):
        segment = ordered[max(start - 1, 0):start + size]
        span_ns = segment[-1][1] - segment[0][1]
        if len(segment) > 1 and span_ns > 0:
            rates.append((len(segment) - 1) * datagram_bytes / (span_ns / 1e9))
    if not rates:
        raise TrainLookError("the train's datagrams all arrived at one instant: no rate to read")
    return statistics.median(rates)


# -- the sender ------------------------------------------------------------------
class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(_Iovec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("length", ctypes.c_uint)]


_libc = ctypes.CDLL(None, use_errno=True)  # the C library this process already has
_sendmmsg = getattr(_libc, "sendmmsg", None)


def send_train(sock: socket.socket, datagrams: Sequence[bytes]) -> None:
    """The datagrams to `sock`'s connected peer in one sendmmsg call (one sendto
    each, where the C library has none: a Python loop is slower than a fast link)."""
    if _sendmmsg is None:
        for datagram in datagrams:
            sock.send(datagram)
        return
    buffers = [ctypes.create_string_buffer(d, len(d)) for d in datagrams]
    iovecs = (_Iovec * len(datagrams))(*[_Iovec(ctypes.addressof(b), len(b.raw)) for b in buffers])
    messages = (_Mmsghdr * len(datagrams))()
    for i in range(len(datagrams)):
        messages[i].hdr.iov = ctypes.pointer(iovecs[i])
        messages[i].hdr.iovlen = 1
    sent = 0
    while sent < len(datagrams):
        n = _sendmmsg(sock.fileno(), ctypes.byref(messages, sent * ctypes.sizeof(_Mmsghdr)),
                      len(datagrams) - sent, 0)
        if n < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            raise OSError(err, f"sendmmsg: {os.strerror(err)}")
        sent += n


def train_look(peer: str, port: int, train_bytes: int, *, timeout_s: float = 1.0,
               netns: str | None = None) -> Measurement:
    """One look at the path to `peer`'s TrainServer: a train of about `train_bytes`.
    Its duration_s is how long the train held the link (first to last arrival),
    its bytes_sent the train's payload, its rtt_min_s the time from sending the
    train to its answer less that hold (the path's round trip and whatever queue
    the train waited behind); TrainLookError when it reads nothing."""
    count = min(max(math.ceil(train_bytes / DATAGRAM_BYTES), MIN_DATAGRAMS), MAX_DATAGRAMS)
    train_id = secrets.randbits(64)
    padding = bytes(DATAGRAM_BYTES - _HEADER.size)
    datagrams = [_HEADER.pack(_TRAIN_MAGIC, train_id, seq, count) + padding for seq in range(count)]
    family, address = socket_address(peer, port, socket.SOCK_DGRAM)
    with socket_in(netns, family, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER_BYTES)
        sock.connect(address)
        try:
            sent = time.monotonic()
            send_train(sock, datagrams)
            stamps = _await_stamps(sock, train_id, timeout_s)
            answered = time.monotonic()
        except ConnectionRefusedError:
            raise TrainLookError(f"{peer} port {port}/udp refused the look: nothing serves looks there") from None
    rate = train_rate(stamps)
    held_s = (max(ns for _, ns in stamps) - min(ns for _, ns in stamps)) / 1e9
    return Measurement(peer=peer, kind=LOOK, bandwidth_bps=8 * rate, beta_s_per_byte=1 / rate,
                       duration_s=held_s, bytes_sent=count * DATAGRAM_BYTES,
                       rtt_min_s=max(0.0, answered - sent - held_s))


def _await_stamps(sock: socket.socket, train_id: int, timeout_s: float) -> list[tuple[int, int]]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise TrainLookError(f"no answer to the look within {timeout_s:g} s "
                                 "(is the peer's agent serving looks?)")
        reply = sock.recv(65536)
        if len(reply) >= _REPLY.size:
            magic, got_id, n = _REPLY.unpack_from(reply)
            if magic == _REPLY_MAGIC and got_id == train_id and len(reply) >= _REPLY.size + n * _STAMP.size:
                return [_STAMP.unpack_from(reply, _REPLY.size + i * _STAMP.size) for i in range(n)]


# -- the receiver ----------------------------------------------------------------
@dataclass
class _Train:
    count: int
    stamps: list[tuple[int, int]] = field(default_factory=list)  # (seq, kernel ns)
    heard: float = 0.0  # monotonic, when its last datagram came


class TrainServer:
    """Answers looks on UDP `port` at `bind`: each train's datagrams stamped as
    the kernel received them, sent back once its last datagram came (or nothing
    more came for TRAIN_IDLE_S). Datagrams that are not a look's are dropped and
    counted, and each sender of them named once in the log."""

    def __init__(self, port: int = DEFAULT_LOOK_PORT, *, bind: str, netns: str | None = None) -> None:
        self.port = port
        self.bind = bind
        self.netns = netns
        self.answered = 0
        self.ignored = 0
        self._trains: dict[tuple[object, int], _Train] = {}
        self._named: set[str] = set()
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TrainServer:
        """Bind and serve in a thread of its own; OSError (naming the address) if it cannot bind."""
        family, address = socket_address(self.bind, self.port, socket.SOCK_DGRAM)
        sock = socket_in(self.netns, family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)
            sock.bind(address)
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"look server: cannot bind {self.bind} port {self.port}/udp: "
                                     f"{exc.strerror}") from None
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name=f"look-server-{self.bind}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._sock is not None:
            self._sock.close()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                if select.select([self._sock], [], [], TRAIN_IDLE_S / 2)[0]:
                    data, ancillary, _, sender = self._sock.recvmsg(2048, 64)
                    self._take(data, ancillary, sender)
                self._answer_idle(time.monotonic())
            except OSError as exc:  # one bad datagram or answer must not end the server
                log.warning("look server: %s; serving on", exc, extra={"fields": {"port": self.port}})

    def _take(self, data: bytes, ancillary: list[tuple[int, int, bytes]], sender: object) -> None:
        if len(data) != DATAGRAM_BYTES or _HEADER.unpack_from(data)[0] != _TRAIN_MAGIC:
            self._ignore(sender)
            return
        _, train_id, seq, count = _HEADER.unpack_from(data)
        if not 0 < count <= MAX_DATAGRAMS or seq >= count:
            self._ignore(sender)
            return
        key = (sender, train_id)
        train = self._trains.get(key)
        if train is None:
            if len(self._trains) >= MAX_TRAINS:
                self._answer(min(self._trains, key=lambda k: self._trains[k].heard))
            train = self._trains[key] = _Train(count)
        train.stamps.append((seq, _kernel_ns(ancillary)))
        train.heard = time.monotonic()
        if seq == train.count - 1 or len(train.stamps) >= train.count:
            self._answer(key)

    def _answer_idle(self, now: float) -> None:
        for key in [k for k, t in self._trains.items() if now - t.heard >= TRAIN_IDLE_S]:
            self._answer(key)

    def _answer(self, key: tuple[object, int]) -> None:
        assert self._sock is not None
        train = self._trains.pop(key)
        first = min(ns for _, ns in train.stamps)
        stamps = [(seq, min(ns - first, 0xFFFFFFFF)) for seq, ns in train.stamps]
        reply = _REPLY.pack(_REPLY_MAGIC, key[1], len(stamps)) + b"".join(_STAMP.pack(*s) for s in stamps)
        self.answered += 1  # before it goes: the sender reads the count as soon as it has the answer
        try:
            self._sock.sendto(reply, key[0])
        except OSError as exc:  # the sender went away: nothing to answer
            self.answered -= 1
            log.debug("look answer to %s not sent: %s", key[0], exc)

    def _ignore(self, sender: object) -> None:
        self.ignored += 1
        who = str(sender[0] if isinstance(sender, tuple) else sender)
        if who not in self._named and len(self._named) < MAX_NAMED:
            self._named.add(who)
            log.warning("look server: ignored a datagram from %s that is not a flexcomm look "
                        "(such datagrams from it are dropped and counted)", who,
                        extra={"fields": {"sender": who, "port": self.port}})


def _kernel_ns(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The kernel's receive time of a datagram (SO_TIMESTAMPNS), else now."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            return seconds * 1_000_000_000 + nanoseconds
    return time.time_ns()
