"""Bandwidth with the iperf3 binary: one client test, and a managed server.

`run_test` runs `iperf3 -c PEER --json` as an argument list (no shell) in a new
process group with a timeout: at the timeout iperf3 is interrupted (SIGINT, on
which it reports what its sender sent so far, `IperfTimeout.sent_bps`), and the
whole group is killed with SIGKILL and reaped if it has not ended a moment
later or the caller is interrupted; if the caller itself is killed the kernel
kills the client (parent-death signal), so no iperf3 is left behind. The first JSON object
on stdout is parsed (iperf3 may print warnings before it) and iperf3's own
"error" is raised as `IperfError`; a server already running a test answers
"busy", raised as `IperfBusy` so a scheduler can back off and retry.

`IperfServer` keeps one `iperf3 -s` per node on a port, restarting it when it
dies (a watchdog thread). An iperf3 server runs one test at a time, which is why
bandwidth tests must be exclusive per target (see `scheduler`).

`netns=NAME` runs the process inside a network namespace (`ip netns exec`), for
the lab and the tests; the daemon on a real node leaves it None.

iperf3's own authentication is optional: a server given a `ServerAuth` (its RSA
private key and a file of authorized users) runs only tests whose client gives a
`ClientAuth` (user name, the server's RSA public key, the password from a file,
handed to iperf3 in $IPERF3_PASSWORD, never on its command line).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from flexcomm.probe.process_group import end_group, signal_group
from flexcomm.store.records import BANDWIDTH, Measurement

DEFAULT_PORT = 5201
CONNECT_TIMEOUT_S = 3.0
# Beyond duration and connect: iperf3's start-up, parameter exchange and results.
TIMEOUT_SLACK_S = 5.0
# How long an interrupted iperf3 gets to print its report before it is killed.
INTERRUPT_GRACE_S = 1.0


class IperfError(RuntimeError):
    """An iperf3 test failed; the message says why (iperf3's own words when it gave any)."""


class IperfMissing(IperfError):
    """The iperf3 binary is not on PATH."""


class IperfBusy(IperfError):
    """The server is running another test: try again later."""


class IperfUnconnected(IperfError):
    """The test never connected to the server (refused, no route, timed out
    connecting): nothing of it crossed the path."""


class IperfTimeout(IperfError):
    """The test overran its timeout and was ended. sent_bps: its sender's rate
    past the first second (`sent_so_far_bps`), None without one: what entered the
    socket, which a long test's sending holds to the path's rate."""

    def __init__(self, message: str, pid: int, sent_bps: float | None = None) -> None:
        super().__init__(message)
        self.pid = pid
        self.sent_bps = sent_bps


@dataclass(frozen=True)
class ServerAuth:
    """iperf3 server authentication: PEM RSA private key, and the authorized users
    file (lines `user,sha256("{user}password")`)."""

    private_key: str
    authorized_users: str

    def argv(self) -> list[str]:
        return ["--rsa-private-key-path", self.private_key, "--authorized-users-path", self.authorized_users]


@dataclass(frozen=True)
class ClientAuth:
    """iperf3 client authentication: user name, the servers' PEM RSA public key, and
    a file holding the password (read at each test, so it can be rotated)."""

    username: str
    public_key: str
    password_file: str

    def argv(self) -> list[str]:
        return ["--username", self.username, "--rsa-public-key-path", self.public_key]

    def env(self) -> dict[str, str]:
        try:
            with open(self.password_file) as fh:
                password = fh.read().rstrip("\n")
        except OSError as exc:
            raise IperfError(f"iperf3: cannot read the password file {self.password_file}: "
                             f"{exc.strerror}") from None
        return {**os.environ, "IPERF3_PASSWORD": password}


@dataclass(frozen=True)
class IperfResult:
    """A finished TCP test. bandwidth_bps is what the receiver got (bits/s of
    payload); rtt_mean_s is the sender's smoothed TCP RTT (Linux), if reported."""

    peer: str
    port: int
    bandwidth_bps: float
    sent_bps: float
    retransmits: int
    duration_s: float
    streams: int
    reverse: bool
    rtt_mean_s: float | None


def find_iperf3(binary: str = "iperf3") -> str:
    """The absolute path of `binary`, or IperfMissing naming it."""
    path = shutil.which(binary)
    if path is None:
        raise IperfMissing(
            f"iperf3: binary {binary!r} not found on PATH "
            f"({os.environ.get('PATH', '')!r}); install iperf3 (e.g. apt-get install iperf3)"
        )
    return path


def in_netns(netns: str | None, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


def first_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in `text` (anything before it or after it ignored)."""
    start = text.find("{")
    if start < 0:
        raise IperfError("iperf3: printed no JSON report")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise IperfError(f"iperf3: unreadable JSON report ({exc})") from None
    if not isinstance(obj, dict):
        raise IperfError("iperf3: JSON report is not an object")
    return obj


def parse_report(report: dict[str, Any], peer: str, port: int) -> IperfResult:
    """An IperfResult from iperf3's JSON report, or its "error" raised."""
    error = report.get("error")
    if error:
        message = f"iperf3 to {peer}:{port}: {error}"
        if "busy" in str(error).lower():
            raise IperfBusy(message)
        raise (IperfUnconnected if never_connected(report) else IperfError)(message)
    try:
        end, test = report["end"], report["start"]["test_start"]
        received, sent = end["sum_received"], end["sum_sent"]
        rtts = [s["sender"]["mean_rtt"] for s in end.get("streams", [])
                if "mean_rtt" in s.get("sender", {})]
        result = IperfResult(
            peer=peer, port=port,
            bandwidth_bps=float(received["bits_per_second"]),
            sent_bps=float(sent["bits_per_second"]),
            retransmits=int(sent.get("retransmits", 0)),
            duration_s=float(received["seconds"]),
            streams=int(test["num_streams"]),
            reverse=bool(test["reverse"]),
            rtt_mean_s=sum(rtts) / len(rtts) / 1e6 if rtts else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise IperfError(f"iperf3 to {peer}:{port}: report lacks {exc}") from None
    if not result.bandwidth_bps > 0:
        # a 64 KB test beside a job's syncs on the cnn lab's 160 Mbit/s link once said so
        raise IperfError(f"iperf3 to {peer}:{port}: the receiver reported nothing received")
    return result


def never_connected(report: dict[str, Any]) -> bool:
    """Whether iperf3's report says its test never connected (no stream set up)."""
    start = report.get("start")
    return isinstance(start, dict) and start.get("connected") == []


def sent_so_far_bps(report: dict[str, Any]) -> float | None:
    """An interrupted test's sender rate over its intervals after the first, which
    holds the socket buffer filling (on a 10 Mbit/s link the first second read 20
    Mbit/s, the next ones 7-10); None before a second interval began."""
    try:
        steady = [i["sum"] for i in report.get("intervals", [])][1:]
        seconds = sum(float(i["seconds"]) for i in steady)
        rate = 8 * sum(float(i["bytes"]) for i in steady) / seconds if seconds > 0 else 0.0
    except (KeyError, TypeError, ValueError):
        return None
    return rate or None


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen:
    """Start `argv` in a new process group, SIGKILLed by the kernel when the thread
    that spawned it ends (PR_SET_PDEATHSIG; Linux ties it to the spawning thread,
    not the process), set by util-linux's setpriv just before it execs `argv`.
    No Python runs between fork and exec: with a `preexec_fn` doing the prctl, a
    gRPC fork handler crashed about one child in six while the agent's server was
    busy, and the probe read "no JSON report"."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise IperfMissing("setpriv: not found on PATH; it ties iperf3 to the agent's life "
                           "(util-linux, e.g. apt-get install util-linux)")
    return subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", *argv], stdin=subprocess.DEVNULL,
                            start_new_session=True, **popen)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (unless `proc` was reaped), and reap `proc`."""
    end_group(proc, 0.0, signal.SIGKILL)


def run_test(peer: str, *, port: int = DEFAULT_PORT, duration_s: float = 2.0, bytes_: int | None = None,
             streams: int = 1, reverse: bool = False, omit_s: int = 0, timeout_s: float | None = None,
             connect_timeout_s: float = CONNECT_TIMEOUT_S, netns: str | None = None,
             binary: str = "iperf3", auth: ClientAuth | None = None) -> IperfResult:
    """One TCP test to `peer`'s iperf3 server: `duration_s` long, or until
    `bytes_` are sent (then `duration_s` bounds how long that may take, with the
    usual slack). Raises IperfError (IperfBusy, IperfUnconnected, IperfTimeout,
    IperfMissing) on failure."""
    if duration_s < 1 or duration_s != int(duration_s):
        # iperf3 reads -t as whole seconds, and -t 0 runs forever
        raise ValueError(f"duration_s: iperf3 runs whole seconds >= 1, got {duration_s!r}")
    if streams < 1:
        raise ValueError(f"streams: must be >= 1, got {streams!r}")
    if bytes_ is not None and bytes_ < 1:
        raise ValueError(f"bytes_: must be >= 1, got {bytes_!r}")
    length = ["-n", str(bytes_)] if bytes_ is not None else ["-t", str(int(duration_s))]
    argv = [find_iperf3(binary), "-c", peer, "-p", str(port), "--json", *length, "-P", str(streams),
            "--connect-timeout", str(max(1, int(connect_timeout_s * 1000)))]
    if omit_s:
        argv += ["-O", str(int(omit_s))]
    if reverse:
        argv.append("-R")
    if auth is not None:
        argv += auth.argv()
    if timeout_s is None:
        timeout_s = duration_s + omit_s + connect_timeout_s + TIMEOUT_SLACK_S
    proc = spawn(in_netns(netns, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env=auth.env() if auth is not None else None)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise _ended(proc, f"iperf3 to {peer}:{port}: no result within {timeout_s:g} s") from None
    except BaseException:
        kill_group(proc)
        raise
    try:
        report = first_json_object(out)
    except IperfError as exc:
        detail = (err or "").strip()[-300:] or f"exit code {proc.returncode}"
        raise IperfError(f"iperf3 to {peer}:{port}: {exc} ({detail})") from None
    return parse_report(report, peer, port)


def _ended(proc: subprocess.Popen, message: str) -> IperfTimeout | IperfUnconnected:
    """Interrupt an overrunning test (iperf3 then reports what it sent so far), kill
    its group if it has not ended within INTERRUPT_GRACE_S, and say what it sent
    (IperfUnconnected where it was still connecting)."""
    signal_group(proc, signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
    except BaseException:
        kill_group(proc)
        raise
    try:
        report = first_json_object(out or "")
    except IperfError:
        report = {}
    if never_connected(report):
        return IperfUnconnected(f"{message}, ended before it connected")
    sent_bps = sent_so_far_bps(report)
    said = f"; its sender ran at {sent_bps / 1e6:.3g} Mbit/s" if sent_bps else ""
    return IperfTimeout(f"{message}, ended{said}", proc.pid, sent_bps)


def bandwidth_measurement(result: IperfResult) -> Measurement:
    """The store's record of a finished test: beta = 8 / bandwidth (s per byte)."""
    return Measurement(
        peer=result.peer, kind=BANDWIDTH, bandwidth_bps=result.bandwidth_bps,
        beta_s_per_byte=8.0 / result.bandwidth_bps if result.bandwidth_bps > 0 else None,
        streams=result.streams, reverse=result.reverse, duration_s=result.duration_s,
    )


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def listening(pid: int, port: int) -> bool:
    """Whether process `pid` itself holds a TCP socket listening on `port` (read
    from /proc, so nothing connects to the server to find out, and another
    process's socket on the port does not count)."""
    inodes = _socket_inodes(pid)
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = [line.split() for line in list(f)[1:]]
        except (FileNotFoundError, ProcessLookupError):
            return False
        for row in rows:
            if row[3] == "0A" and int(row[1].rsplit(":", 1)[1], 16) == port and row[9] in inodes:
                return True
    return False


class IperfServer:
    """A managed `iperf3 -s` on `port`, restarted by a watchdog when it dies.

    Use as a context manager, or start()/stop(). `restarts` counts restarts after
    the first start; `pid` is the current server's pid. The watchdog thread
    spawns every server itself, and each server gets SIGKILL when that thread
    ends (PR_SET_PDEATHSIG): a daemon killed with SIGKILL leaves no orphan
    iperf3 holding the port.
    """

    LOG_LIMIT_BYTES = 64 * 1024

    def __init__(self, port: int = DEFAULT_PORT, *, bind: str | None = None,
                 netns: str | None = None, binary: str = "iperf3", auth: ServerAuth | None = None,
                 check_interval_s: float = 1.0, ready_timeout_s: float = 10.0) -> None:
        self.port = port
        self.bind = bind
        self.auth = auth
        self.netns = netns
        self.binary = binary
        self.check_interval_s = check_interval_s
        self.ready_timeout_s = ready_timeout_s
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> IperfServer:
        """Start the server and its watchdog; IperfError (IperfMissing included)
        when it cannot start."""
        self._stopping.clear()
        started: queue.Queue[BaseException | None] = queue.Queue(maxsize=1)
        self._watchdog = threading.Thread(target=self._watch, args=(started,),
                                          name=f"iperf3-server-{self.port}", daemon=True)
        self._watchdog.start()
        error = started.get()
        if error is not None:
            self._watchdog.join()
            raise error
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._watchdog:
            self._watchdog.join()
        with self._lock:
            if self._proc:
                kill_group(self._proc)
            if self._log:
                self._log.close()
                self._log = None

    def __enter__(self) -> IperfServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _restart_if_dead(self) -> None:
        with self._lock:
            if self._stopping.is_set() or (self._proc and self._proc.poll() is None):
                return
            self._spawn()
            self.restarts += 1

    def _argv(self) -> list[str]:
        argv = [find_iperf3(self.binary), "-s", "-p", str(self.port)]
        argv += ["-B", self.bind] if self.bind else []
        return in_netns(self.netns, argv + (self.auth.argv() if self.auth else []))

    def _spawn(self) -> None:
        if self._log is None:
            self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
            # O_APPEND: the server keeps writing at the end after we read or truncate it
            flags = fcntl.fcntl(self._log.fileno(), fcntl.F_GETFL)
            fcntl.fcntl(self._log.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
        self._log.truncate(0)
        self._proc = spawn(self._argv(), stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + self.ready_timeout_s
        while not listening(self._proc.pid, self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                kill_group(self._proc)
                raise IperfError(f"iperf3 server on port {self.port} did not start: {self._log_tail()}")
            time.sleep(0.02)

    def _log_tail(self) -> str:
        assert self._log is not None
        self._log.seek(0)
        text = self._log.read().decode(errors="replace").strip()
        return text[-300:] or f"exit code {self._proc.returncode if self._proc else None}"

    def _watch(self, started: queue.Queue[BaseException | None]) -> None:
        try:
            with self._lock:
                self._spawn()
        except Exception as exc:
            started.put(exc)
            return
        started.put(None)
        while not self._stopping.wait(self.check_interval_s):
            with contextlib.suppress(IperfError):  # tried again at the next check
                self._restart_if_dead()
            with self._lock:
                if self._log and os.fstat(self._log.fileno()).st_size > self.LOG_LIMIT_BYTES:
                    self._log.truncate(0)
