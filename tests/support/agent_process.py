"""A real `flexcomm agent` process for tests: temp socket, temp store, a free
metrics port, probing off (tests that want probes turn it on: probe=True).

Whoever starts one ends it: `running(...)` or the `agent_process` fixture
(tests/conftest.py) kill it however the test ends, and a start that fails kills
the process it started. Waits are polls with load-scaled deadlines
(support/waiting.py)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flexcomm.lab.netns import Node
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc
from support.waiting import scaled, wait_for

__all__ = ["AgentProcess", "free_port", "in_namespace", "job_ids", "metrics_text", "running", "spec",
           "wait_for"]


def _ephemeral_ports() -> range:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port nothing holds now, TCP or (SOCK_DGRAM) UDP, outside the
    kernel's ephemeral range: one from inside it (a bind to port 0) can be given
    to another test's outgoing connection before the process it is meant for
    binds it (an agent's metrics port was, in a CI run)."""
    ephemeral, rng = _ephemeral_ports(), random.Random()
    for _ in range(1000):
        port = rng.randrange(10000, 65536)
        if port in ephemeral:
            continue
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range")


class AgentProcess:
    def __init__(self, workdir: Path, *extra: str, env: dict[str, str] | None = None,
                 probe: bool = False) -> None:
        self.workdir = workdir
        self.socket = str(workdir / "agent.sock")
        self.db = str(workdir / "agent.db")
        self.metrics_port = free_port()
        self.extra = list(extra)
        self.probe = probe
        # a probing agent serves looks: on a port of its own, beside other tests' agents
        if probe and "--probe-look-port" not in self.extra:
            self.extra += ["--probe-look-port", str(free_port(socket.SOCK_DGRAM))]
        # "agent ready" is an info line: an agent started quieter says nothing to wait for
        level = self.extra[self.extra.index("--log-level") + 1] if "--log-level" in self.extra else "info"
        self.says_ready = level in ("debug", "info")
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "agent.log"
        self._log_from = 0  # where this start's lines begin in the log
        self._channel: grpc.Channel | None = None

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "flexcomm.cli", "agent", "--socket", self.socket, "--db", self.db,
                "--metrics", f"127.0.0.1:{self.metrics_port}", *([] if self.probe else ["--no-probe"]),
                "--flush-interval", "200ms", *self.extra]

    def start(self, timeout_s: float = 30.0) -> AgentProcess:
        """Start it and wait until it has started (`wait_serving`); a start that
        fails leaves no process."""
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, env=self.env)
        try:
            self.wait_serving(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_serving(self, timeout_s: float = 30.0) -> None:
        """Until health says SERVING and the log says "agent ready" (where its log
        level has it say so): the agent serves before its metrics, probing and
        emulation have started, and says it is ready once they have."""
        deadline = time.monotonic() + scaled(timeout_s)
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log.read_text()}")
            if self._serving() and (not self.says_ready
                                    or b'"msg": "agent ready"' in self.log.read_bytes()[self._log_from:]):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"agent not serving after {scaled(timeout_s):.0f}s:\n{self.log.read_text()}")
            time.sleep(0.1)

    def _serving(self) -> bool:
        try:
            return self.health() == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix:{self.socket}")
        return self._channel

    @property
    def stub(self) -> pb_grpc.AgentStub:
        return pb_grpc.AgentStub(self.channel)

    def health(self, service: str = "") -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=scaled(2)).status

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(scaled(10))
        self.close_channel()

    def pause(self) -> None:
        """SIGSTOP: the socket still accepts connections, nothing answers (a hung agent)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: a paused agent answers again (a host that starved it, then let it run)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def terminate(self, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(scaled(timeout_s))
        finally:
            self.close_channel()
        return rc

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # a paused (SIGSTOPped) one too
            self.proc.wait()
        self.close_channel()


def spec(job_id: str = "job-1", policy: str = "moo", **kw: object) -> pb.JobSpec:
    fields = {"world_size": 2, "grad_bytes": 4_000_000, "nodes": ["127.0.0.1"], **kw}
    return pb.JobSpec(job_id=job_id, policy=policy, **fields)


@contextmanager
def running(workdir: Path, *extra: str, env: dict[str, str] | None = None,
            probe: bool = False) -> Iterator[AgentProcess]:
    """An agent serving for the duration of the block, killed after it."""
    proc = AgentProcess(workdir, *extra, env=env, probe=probe)
    try:
        yield proc.start()
    finally:
        proc.stop()


def in_namespace(agent: AgentProcess, node: Node, probe: bool) -> None:
    """Run the agent inside `node`'s namespace (its socket and store stay on the
    shared filesystem), probing or not. Called again, it starts from the helper's
    own command line, not from the one a previous call made."""
    plain = agent.__dict__.setdefault("plain_argv", agent.argv)
    agent.argv = lambda: node.argv([a for a in plain() if probe is False or a != "--no-probe"])


def metrics_text(agent: AgentProcess, node: Node | None = None) -> str:
    """The agent's /metrics; from inside `node`'s namespace when it listens there."""
    url = f"http://127.0.0.1:{agent.metrics_port}/metrics"
    if node is None:
        return urllib.request.urlopen(url, timeout=scaled(5)).read().decode()
    done = node.run([sys.executable, "-c", f"import sys, urllib.request; sys.stdout.write("
                                           f"urllib.request.urlopen({url!r}, timeout=5).read().decode())"],
                    capture_output=True, text=True, timeout=scaled(30))
    assert done.returncode == 0, done.stderr
    return done.stdout


def job_ids(agent: AgentProcess) -> set[str]:
    return {j.spec.job_id for j in agent.stub.ListJobs(pb.ListJobsRequest(), timeout=scaled(5)).jobs}
