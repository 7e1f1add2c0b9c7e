"""One real `flexcomm agent` per lab node, as a user runs them on a cluster.

Each agent runs in its node's namespace with its store (SQLite) and log in the
directory it is given (the lab's: each policy run's `agents/node<i>.db`,
`agents/node<i>.log`), its socket in a short temporary directory. The lab starts
them afresh for each policy run, so every policy meets agents in the same state:
shared across runs, the MOO run after fixed Top-k 0.1 found the duty budget spent
by Top-k's job (its first bandwidth test 108 s off) and began from that job's
last probe, taken on the slow phase. Rank 0's hook asks
node 0's agent; the other agents serve iperf3 so that node 0's agent can probe
the paths to them. Agents do no shaping here: the lab drives the schedule on
every link itself, and tells each agent the links' token bucket. On loopback
(no namespaces) only node 0's agent runs, without probing (every node is
127.0.0.1, and the iperf3 ports would collide).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flexcomm.lab.cluster import LabCluster
from flexcomm.policy.types import PLAIN_LINK, LinkBucket
from flexcomm.sockets import unix_socket_listening

START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class AgentHandle:
    node: int
    socket: Path
    db: Path
    log: Path


def agent_command(sock: Path, db: Path, probe: bool, bucket: LinkBucket = PLAIN_LINK,
                  serve_on: str = "") -> list[str]:
    """The agent's command line; `bucket` is the lab links' token bucket, for its cost model;
    `serve_on` the node's address, where it serves iperf3 (the other nodes' agents have no
    job to tell them where, as on a real cluster; docs/DEPLOYMENT.md)."""
    cmd = [sys.executable, "-m", "flexcomm.cli", "agent", "--socket", str(sock), "--db", str(db),
           "--metrics", "", "--log-format", "text",
           "--link-peak-over-rate", repr(bucket.peak_over_rate), "--link-burst", f"{bucket.burst_s!r}s"]
    if not probe:
        cmd.append("--no-probe")
    elif serve_on:
        cmd += ["--probe-serve-bind", serve_on]
    return cmd


@contextmanager
def running_agents(lab: LabCluster, socket_dir: Path, db_dir: Path,
                   timeout_s: float = START_TIMEOUT_S) -> Iterator[list[AgentHandle]]:
    """The agents (sockets in `socket_dir`, stores and logs in `db_dir`), each
    answering on its socket, for the block; stopped (SIGTERM) when it ends."""
    db_dir.mkdir(parents=True, exist_ok=True)
    count = len(lab.nodes) if lab.shaped else 1
    started: list[tuple[AgentHandle, subprocess.Popen]] = []
    try:
        for i in range(count):
            handle = AgentHandle(i, socket_dir / f"node{i}.sock", db_dir / f"node{i}.db",
                                 db_dir / f"node{i}.log")
            handle.socket.unlink(missing_ok=True)
            proc = lab.spawn(i, agent_command(handle.socket, handle.db, probe=lab.shaped, bucket=lab.bucket,
                                              serve_on=lab.nodes[i].address), log=handle.log)
            started.append((handle, proc))
        deadline = time.monotonic() + timeout_s
        for handle, proc in started:
            _wait_listening(handle, proc, deadline)
        yield [h for h, _ in started]
    finally:
        for _, proc in started:
            lab.stop(proc)


def _wait_listening(handle: AgentHandle, proc: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agent on node {handle.node} exited with code {proc.returncode}; "
                               f"see {handle.log}")
        if unix_socket_listening(handle.socket):
            return
        time.sleep(0.1)
    raise RuntimeError(f"agent on node {handle.node} did not listen on {handle.socket} "
                       f"within {START_TIMEOUT_S:.0f} s; see {handle.log}")


