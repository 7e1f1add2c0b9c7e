"""The agent as a real process (`flexcomm agent` on a temp Unix socket and a
temp store): registration, reports, decisions that follow the reported network,
restarts (kill -9 and SIGTERM), the operations surface (health, reflection,
metrics, sd_notify, socket permissions) and `flexcomm status`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from flexcomm.policy.types import Compression
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto.convert import collective_from_enum
from flexcomm.store import Measurement, Store
from support.agent_process import AgentProcess, running, spec, wait_for

GRAD_BYTES = 40_000_000
FAST = (5e-5, 100e9)  # alpha_s, bandwidth_bps: dense's sync (3 ms) is cheaper than compressing (10 ms)
SLOW = (1e-3, 100e6)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    with running(tmp_path) as proc:
        yield proc


def wire_seconds(d: pb.Decision, network: tuple[float, float]) -> float:
    """A 2-rank job's sync on a plain link of `network` (alpha_s, bits/s), by hand:
    the messages on its critical path and the bytes each rank puts on the link."""
    alpha, bps = network
    c = Compression(d.family, d.param)
    m = GRAD_BYTES / 2 if c.family == "bf16" else GRAD_BYTES  # bf16: two bytes a value
    k = c.param * m if c.family == "topk" else 0.0  # bytes of the kept values
    messages, wire_bytes = {
        "dense_ring": (2, m),  # reduce-scatter, then all-gather: half the gradient each
        "dense_tree": (2, 2 * m),  # reduce to the root, broadcast back
        "ag_topk": (1, 2 * k),  # each rank's values and as many int32 indices
        "art_ring": (3, 2 * k),  # the root's indices, then a ring over the values
        "art_tree": (3, 3 * k),  # the root's indices, then a tree over the values
    }[collective_from_enum(d.collective)]
    return messages * alpha + wire_bytes * 8 / bps


def simulated_steps(stub, job_id: str, network: tuple[float, float], steps: int, first_step: int,
                    ) -> list[pb.Decision]:
    """A job whose sync times are what the wire of `network` takes (`wire_seconds`,
    not the agent's own cost model), reporting one step per message with its own
    estimate of the network, as rank 0 would."""
    decisions = [stub.GetDecision(pb.JobRef(job_id=job_id), timeout=5)]
    for step in range(first_step, first_step + steps):
        d = decisions[-1]
        c = Compression(d.family, d.param)
        gains = {name: min(1.0, Compression.parse(name).cr ** 0.15) for name in d.probes}
        report = pb.StepReport(
            step=step, epoch=step // 10, family=d.family, param=d.param, collective=d.collective,
            t_comp_s=0.0 if c.family == "dense" else 0.01, t_compute_s=0.1,
            t_sync_s=wire_seconds(d, network),
            gain=gains.get(c.name, 1.0), bytes_sent=int(GRAD_BYTES * c.cr),
            gains=[pb.Gain(compression=name, gain=g) for name, g in gains.items()])
        request = pb.ReportStepsRequest(job_id=job_id, reports=[report],
                                        network=pb.NetworkEstimate(alpha_s=network[0],
                                                                   bandwidth_bps=network[1]))
        decisions.append(stub.ReportSteps(iter([request]), timeout=5).decision)
    return decisions


def choice(d: pb.Decision) -> tuple[str, str]:
    return Compression(d.family, d.param).name, collective_from_enum(d.collective)


def test_decisions_follow_the_reported_network(agent: AgentProcess) -> None:
    stub = agent.stub
    reply = stub.RegisterJob(pb.RegisterJobRequest(spec=spec("net-job", grad_bytes=GRAD_BYTES)), timeout=5)
    assert not reply.resumed and reply.decision.version == 1

    fast = simulated_steps(stub, "net-job", FAST, 40, 0)
    assert fast[-1].family in ("dense", "bf16"), "lossy compression does not pay at 100 Gbit/s"
    slow = simulated_steps(stub, "net-job", SLOW, 40, 40)
    assert slow[-1].family == "topk", "at 100 Mbit/s the policy should compress"
    assert slow[-1].version > fast[-1].version
    back = simulated_steps(stub, "net-job", FAST, 40, 80)
    assert back[-1].version > slow[-1].version
    assert back[-1].family in ("dense", "bf16"), "a fast network again: nothing lost"

    net = stub.GetNetwork(pb.GetNetworkRequest(job_id="net-job"), timeout=5)
    assert net.bottleneck.known and net.bottleneck.bandwidth_bps == pytest.approx(FAST[1], rel=1e-3)  # syncs refine it
    info = stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs[0]
    assert (info.spec.job_id, info.last_step, info.reports) == ("net-job", 119, 120)


def test_a_reported_network_change_alone_starts_a_new_measurement(agent: AgentProcess) -> None:
    """The job's own network estimate reaches its policy: the sync times stay those
    of the slow link, only the estimate moves, and the policy measures again."""
    stub = agent.stub
    stub.RegisterJob(pb.RegisterJobRequest(spec=spec("estimated", grad_bytes=GRAD_BYTES)), timeout=5)
    settled = simulated_steps(stub, "estimated", SLOW, 40, 0)[-1]
    report = pb.StepReport(step=40, family=settled.family, param=settled.param, collective=settled.collective,
                           t_comp_s=0.01, t_compute_s=0.1, t_sync_s=wire_seconds(settled, SLOW), gain=0.5)
    moved = pb.ReportStepsRequest(job_id="estimated", reports=[report],
                                  network=pb.NetworkEstimate(alpha_s=FAST[0], bandwidth_bps=FAST[1]))
    after = stub.ReportSteps(iter([moved]), timeout=5).decision
    # the syncs since the last report refined its 100 Mbit/s within noise
    assert after.version > settled.version
    assert re.search(r"network moved \(report\): bandwidth 10[01](\.\d+)? -> 1e\+05 Mbit/s", after.reason)


def test_the_configured_token_bucket_reaches_the_model_and_status(tmp_path: Path) -> None:
    with running(tmp_path, "--link-peak-over-rate", "1.2", "--link-burst", "5ms") as agent:
        agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("bucketed", policy="dense", grad_bytes=GRAD_BYTES)),
                               timeout=5)
        simulated_steps(agent.stub, "bucketed", SLOW, 2, 0)
        b = agent.stub.GetNetwork(pb.GetNetworkRequest(job_id="bucketed"), timeout=5).bottleneck
        assert (b.known, b.peak_over_rate, b.burst_s) == (True, 1.2, 0.005)
        cmd = [sys.executable, "-m", "flexcomm.cli", "status", "--socket", agent.socket]
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
        assert "token bucket 1.2x for 5 ms" in text
    bad = AgentProcess(tmp_path, "--link-peak-over-rate", "0.5")
    out = subprocess.run(bad.argv(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "link_peak_over_rate: must be in [1.0, 16.0], got 0.5" in out.stderr


def test_watch_decisions_streams_each_change(agent: AgentProcess) -> None:
    stub = agent.stub
    stub.RegisterJob(pb.RegisterJobRequest(spec=spec("watched", grad_bytes=GRAD_BYTES)), timeout=5)
    seen: list[pb.Decision] = []
    ended: list[grpc.StatusCode] = []  # how the stream ended, read here: an assert in the thread fails nothing
    stream = stub.WatchDecisions(pb.WatchDecisionsRequest(job_id="watched"), timeout=60)

    def read() -> None:
        try:
            seen.extend(stream)
            ended.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            ended.append(exc.code())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent = simulated_steps(stub, "watched", SLOW, 30, 0)
    wait_for(lambda: seen and seen[-1].version >= sent[-1].version, what="the last decision on the stream")
    stream.cancel()
    reader.join(10)
    assert ended == [grpc.StatusCode.CANCELLED], "the stream ran until the client cancelled it"
    versions = [d.version for d in seen]
    assert versions == sorted(set(versions)), "versions arrive once each, in order"
    assert versions[0] == 1 and versions[-1] == sent[-1].version
    assert {choice(d) for d in seen} == {choice(d) for d in sent}


def stored_version(agent: AgentProcess, job_id: str) -> int:
    with Store(agent.db) as store:
        state = store.load_policy_state(job_id)
    return state["decision"]["version"] if state else 0


def test_kill_9_and_restart_resumes_every_job(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path).start()
    try:
        stub = agent.stub
        stub.RegisterJob(pb.RegisterJobRequest(spec=spec("survivor", grad_bytes=GRAD_BYTES)), timeout=5)
        stub.RegisterJob(pb.RegisterJobRequest(spec=spec("static-one", policy="static")), timeout=5)
        before = simulated_steps(stub, "survivor", SLOW, 30, 0)[-1]
        wait_for(lambda: stored_version(agent, "survivor") == before.version, what="the job's state in the store")
        info_before = {j.spec.job_id: j for j in stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs}
        agent.kill9()
        with Store(agent.db) as store:  # the store is intact and holds the job's state
            state = store.load_policy_state("survivor")
            assert state["decision"]["version"] == before.version
            assert {j.job_id for j in store.jobs()} == {"survivor", "static-one"}
        agent.start()
        stub = agent.stub
        after = stub.GetDecision(pb.JobRef(job_id="survivor"), timeout=5)
        assert (after.version, choice(after)) == (before.version, choice(before))
        info_after = {j.spec.job_id: j for j in stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs}
        for job_id in ("survivor", "static-one"):
            a, b = info_after[job_id], info_before[job_id]
            assert (a.last_step, a.reports, a.spec) == (b.last_step, b.reports, b.spec)
        # The policy resumed where it was: same network, same choice, no new exploration.
        again = simulated_steps(stub, "survivor", SLOW, 10, 30)
        assert {d.version for d in again} == {before.version}
        resumed = stub.RegisterJob(pb.RegisterJobRequest(spec=spec("survivor", grad_bytes=GRAD_BYTES)),
                                   timeout=5)
        assert resumed.resumed and resumed.decision.version == before.version
    finally:
        agent.stop()


def read_datagrams(listener: socket.socket, into: list[str]) -> None:
    """Append every datagram to `into` until the socket is closed. Read at once, as
    systemd does: a notify socket's queue holds 10 datagrams (net.unix.max_dgram_qlen),
    and a full one blocks the agent's watchdog ping, and with it the agent."""
    with contextlib.suppress(OSError):
        while data := listener.recv(4096):
            into.append(data.decode())


def test_sigterm_is_graceful_and_sd_notify_is_spoken(tmp_path: Path) -> None:
    notify_path = str(tmp_path / "notify.sock")
    messages: list[str] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(notify_path)
        reader = threading.Thread(target=read_datagrams, args=(listener, messages), daemon=True)
        reader.start()
        env = {"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "400000"}
        agent = AgentProcess(tmp_path, env=env)
        try:
            agent.start()
            wait_for(lambda: any("WATCHDOG=1" in m for m in messages), what="a watchdog ping")
            assert messages[0].startswith("READY=1")
            agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("graceful", policy="dense")), timeout=5)
            assert agent.terminate() == 0
            wait_for(lambda: any("STOPPING=1" in m for m in messages), what="STOPPING=1")
        finally:
            agent.stop()
            listener.shutdown(socket.SHUT_RDWR)
    reader.join()
    assert not os.path.exists(agent.socket), "the socket file is removed on shutdown"
    events = [json.loads(line) for line in agent.log.read_text().splitlines() if line.startswith("{")]
    messages = [e["msg"] for e in events]
    assert messages.index("agent ready") < messages.index("job registered") < messages.index("agent stopped")
    registered = events[messages.index("job registered")]
    assert registered["job"] == "graceful" and registered["level"] == "info" and registered["ts"] > 0
    with Store(agent.db) as store:
        assert store.job("graceful") is not None


def test_operations_surface(agent: AgentProcess) -> None:
    mode = stat.S_IMODE(os.stat(agent.socket).st_mode)
    assert mode == 0o600, f"socket mode {oct(mode)}"
    assert agent.health(f"{pb.DESCRIPTOR.package}.Agent") == 1  # SERVING

    reflection = reflection_pb2_grpc.ServerReflectionStub(agent.channel)
    answer = next(reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
    names = {s.name for s in answer.list_services_response.service}
    assert {"flexcomm.v1.Agent", "grpc.health.v1.Health"} <= names

    agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("metered", grad_bytes=GRAD_BYTES)), timeout=5)
    simulated_steps(agent.stub, "metered", SLOW, 5, 0)
    with pytest.raises(grpc.RpcError):
        agent.stub.GetDecision(pb.JobRef(job_id="nobody"), timeout=5)
    body = urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=5).read().decode()
    assert 'flexcomm_agent_rpcs_total{code="OK",method="ReportSteps"} 5.0' in body
    assert 'flexcomm_agent_rpcs_total{code="NOT_FOUND",method="GetDecision"} 1.0' in body
    assert 'flexcomm_agent_step_reports_total{job="metered"} 5.0' in body
    assert 'flexcomm_agent_decision_version{job="metered"}' in body
    assert 'flexcomm_agent_model_error{job="metered"}' in body  # the MOO's Calibration.error()
    assert "flexcomm_agent_rpc_latency_seconds_bucket" in body
    assert "flexcomm_agent_jobs 1.0" in body


def test_socket_group_gives_0660(tmp_path: Path) -> None:
    with running(tmp_path, "--socket-group", "root") as agent:
        st = os.stat(agent.socket)
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, 0)
    bad = AgentProcess(tmp_path, "--socket-group", "no-such-group-fca")
    out = subprocess.run(bad.argv(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "socket_group: no group 'no-such-group-fca'" in out.stderr


def test_a_second_agent_on_the_same_socket_is_refused(agent: AgentProcess, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other = AgentProcess(tmp_path / "other")
    other.socket = agent.socket
    out = subprocess.run(other.argv(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "socket: another agent is serving on" in out.stderr
    assert agent.health() == 1  # and the first one is untouched


def test_status_command_shows_jobs_network_and_decisions(agent: AgentProcess) -> None:
    agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("shown", policy="dense", grad_bytes=GRAD_BYTES)), timeout=5)
    simulated_steps(agent.stub, "shown", SLOW, 3, 0)
    cmd = [sys.executable, "-m", "flexcomm.cli", "status", "--socket", agent.socket]
    data = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60,
                                     check=True).stdout)
    job = data["jobs"][0]
    assert job["job_id"] == "shown" and job["decision"]["collective"] == "dense_ring"
    assert job["network"]["bottleneck"]["bandwidth_bps"] == SLOW[1]
    assert job["network"]["bottleneck"]["evidence"] == "report"
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "shown" in text and "dense_ring" in text and "100 Mbit/s" in text
    assert "(last moved on: report)" in text

    down = subprocess.run([*cmd[:-1], str(Path(agent.socket).with_name("none.sock"))],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "cannot reach the agent" in down.stderr


def test_rows_older_than_the_retention_are_pruned(tmp_path) -> None:
    store = Store(str(tmp_path / "agent.db"))
    store.add_measurement(Measurement(peer="10.0.0.9", kind="latency", rtt_p50_s=1e-3, ts=1000.0))
    store.add_measurement(Measurement(peer="10.0.0.9", kind="latency", rtt_p50_s=2e-3))
    store.close()

    def rows() -> list[dict]:
        with Store(str(tmp_path / "agent.db")) as s:
            return s.history("measurements", limit=10)

    with running(tmp_path, "--retention", "1h"):
        wait_for(lambda: len(rows()) == 1, what="pruning")
        assert [r["rtt_p50_s"] for r in rows()] == [2e-3]
