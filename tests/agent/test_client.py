"""The training side's agent client against a real agent process: it registers,
delivers reports, follows decisions, never blocks its caller, keeps the last
decision while the agent is away (saying so once) and comes back by itself."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexcomm.client.agent_client import AgentClient, channel_target
from flexcomm.client.decisions import DecisionSource
from flexcomm.policy.types import Compression, StepReport
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Store
from support.agent_process import AgentProcess, job_ids, running, wait_for
from support.waiting import scaled

GRAD_BYTES = 4_000_000


def reports_of(agent: AgentProcess, job_id: str) -> int:
    jobs = agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs
    return next((j.reports for j in jobs if j.spec.job_id == job_id), -1)


def step(i: int, compression: str = "dense", collective: str = "dense_ring") -> StepReport:
    c = Compression.parse(compression)
    return StepReport(step=i, family=c.family, param=c.param, collective=collective, t_comp_s=0.0, t_sync_s=0.05,
                      gain=1.0, t_compute_s=0.1)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    with running(tmp_path) as proc:
        yield proc


def client_for(agent: AgentProcess, job_id: str, **kw) -> AgentClient:
    return AgentClient(agent.socket, job_id=job_id, world_size=2, grad_bytes=GRAD_BYTES,
                       nodes=["127.0.0.1"], policy=kw.pop("policy", "moo"), timeout_s=kw.pop("timeout_s", 1.0),
                       poll_interval_s=0.1, retry_max_s=0.3, **kw)


def test_it_is_a_decision_source_that_registers_and_delivers_reports(agent: AgentProcess) -> None:
    client = client_for(agent, "client-job")
    try:
        assert isinstance(client, DecisionSource)
        wait_for(lambda: client.latest() is not None, what="the first decision")
        # the MOO warms up on its quality reference as a user runs it (Top-k over AllGather)
        assert client.latest().collective == "ag_topk"
        for i in range(3000):
            client.report(step(i))
        wait_for(lambda: reports_of(agent, "client-job") == 3000, what="3000 reports")
        client.report_network(1e-3, 100e6)
        wait_for(lambda: agent.stub.GetNetwork(pb.GetNetworkRequest(job_id="client-job"), timeout=5)
                 .bottleneck.bandwidth_bps == 100e6, what="the job's network estimate")
    finally:
        client.close()


@pytest.mark.parametrize(("kw", "field"), [
    ({"job_id": "moo:c_low=0.01"}, "spec.job_id"),
    ({"job_id": "job\n"}, "spec.job_id"),
    ({"options": {"c_low": 7}}, "spec.options.c_low"),
    ({"options": {"bogus": 1}}, "spec.options.bogus"),
    ({"world_size": 1}, "spec.world_size"),
    ({"policy": "fastest"}, "spec.policy"),
    ({"nodes": ["10.0.0.1", "10.0.0.1"]}, "spec.nodes"),
    ({"nodes": "10.0.0.1"}, "spec.nodes"),
    ({"world_size": -1}, "spec.world_size"),
    ({"world_size": "4"}, "spec.world_size"),
    ({"options": {"x": object()}}, "spec.options"),
    ({"timeout_s": float("nan")}, "timeout_s"),
    ({"poll_interval_s": 0}, "poll_interval_s"),
])
def test_a_spec_the_agent_would_refuse_fails_at_construction(tmp_path: Path, kw: dict, field: str) -> None:
    args = {"job_id": "job", "world_size": 2, "grad_bytes": 4096, "policy": "moo", **kw}
    with pytest.raises(ValueError, match=field):
        AgentClient(f"unix://{tmp_path}/none.sock", **args)


def stored_reports(agent: AgentProcess, job_id: str) -> int:
    with Store(agent.db) as store:
        state = store.load_policy_state(job_id)
    return state["reports"] if state else 0


def test_outage_keeps_the_last_decision_never_blocks_and_recovers(
        agent: AgentProcess, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flexcomm.client.agent")
    client = client_for(agent, "outage-job", policy="static", options={"compression": "topk:0.01",
                                                                        "collective": "ag_topk"})
    try:
        wait_for(lambda: client.latest() is not None, what="the first decision")
        before = client.latest()
        for i in range(10):
            client.report(step(i, "topk:0.01", "ag_topk"))
        wait_for(lambda: stored_reports(agent, "outage-job") == 10, what="the reports in the agent's store")
        # First the agent hangs (SIGSTOP: connections are accepted, nothing answers,
        # so a client that called it from the training loop would wait its 1 s RPC
        # timeout), then it dies with kill -9.
        agent.pause()
        slowest = 0.0
        i = 10
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline or client.reachable is not False:  # a training loop
            assert time.monotonic() < deadline + scaled(20), "the client never noticed the hung agent"
            t0 = time.perf_counter()
            decision = client.latest()
            client.report(step(i, "topk:0.01", "ag_topk"))
            slowest = max(slowest, time.perf_counter() - t0)
            assert decision == before
            i += 1
            time.sleep(0.002)
        assert slowest < 0.5, f"a call from the training loop took {slowest * 1e3:.1f} ms (the RPC timeout is 1 s)"
        agent.kill9()
        unreachable = [r for r in caplog.records if "agent unreachable" in r.getMessage()]
        assert len(unreachable) == 1, "the outage is logged once, not per retry"

        agent.start()
        wait_for(lambda: client.reachable, what="reconnection")
        # Resumed, not registered anew: the 10 stored reports count on top of the
        # queued ones (a new registration would start from 0).
        wait_for(lambda: reports_of(agent, "outage-job") >= i, what="the queued reports")
        registered = [r.getMessage() for r in caplog.records if r.getMessage().startswith("registered job")]
        assert "(resumed: True)" in registered[-1]
        assert client.latest() == before
        assert any("agent reachable again" in r.getMessage() for r in caplog.records)
    finally:
        client.close()


def test_agent_absent_at_start(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path)
    client = client_for(agent, "late-agent", policy="dense")
    try:
        t0 = time.perf_counter()
        for i in range(10_000):
            client.report(step(i))
        assert time.perf_counter() - t0 < scaled(2.0)  # never waits on the absent agent
        assert client.latest() is None
        agent.start()
        wait_for(lambda: client.latest() is not None, what="the first decision")
        wait_for(lambda: reports_of(agent, "late-agent") == 10_000, what="the queued reports")
    finally:
        client.close()
        agent.stop()


def test_the_hooks_first_wait_outlasts_a_registration_slower_than_the_rpc_timeout(agent: AgentProcess) -> None:
    # A registration writes the job to the agent's store first: beside two CPU
    # hogs it took over 1 s, the RPC timeout, and the README torchrun job then ran
    # its first 11 steps without the agent's decision. Here the agent is starved
    # (SIGSTOP) for 1 s, over three RPC timeouts.
    agent.pause()
    threading.Timer(1.0, agent.resume).start()
    client = client_for(agent, "slow-register", policy="dense", timeout_s=0.3)
    try:
        t0 = time.monotonic()
        client.use_nodes(["127.0.0.1"])
        assert time.monotonic() - t0 >= 0.9
        assert client.latest() is not None  # the first agreement carries the agent's decision
    finally:
        client.close()


def test_the_hooks_first_wait_ends_at_once_when_no_agent_is_there(tmp_path: Path) -> None:
    client = client_for(AgentProcess(tmp_path), "no-agent", policy="dense", register_timeout_s=30.0)
    try:
        t0 = time.monotonic()
        client.use_nodes(["127.0.0.1"])
        assert time.monotonic() - t0 < scaled(5)  # not the 30 s a slow agent would be given
        assert client.latest() is None
    finally:
        client.close()


def test_close_ends_the_job_at_an_agent_slower_than_the_rpc_timeout(agent: AgentProcess) -> None:
    # A starved agent (SIGSTOP for 1.5 s, five RPC timeouts) answers the end late:
    # with the end held to the RPC timeout, a CI run beside two CPU hogs left
    # the README torchrun job at the agent after its processes had exited.
    client = client_for(agent, "slow-end", policy="dense", timeout_s=0.3)
    wait_for(lambda: client.latest() is not None, what="the first decision")
    assert job_ids(agent) == {"slow-end"}
    agent.pause()
    threading.Timer(1.5, agent.resume).start()
    t0 = time.monotonic()
    client.close(timeout_s=scaled(10))
    assert client.ended and time.monotonic() - t0 >= 1.4
    assert job_ids(agent) == set()


def test_close_ends_the_job_after_a_poll_timed_out(agent: AgentProcess) -> None:
    # A poll past its deadline marks the job for registering again; closing then
    # must still end it (a quiet CI run left the job at the agent so).
    client = client_for(agent, "timed-out-poll", policy="dense", timeout_s=0.3)
    wait_for(lambda: client.latest() is not None, what="the first decision")
    agent.pause()
    try:
        wait_for(lambda: client.reachable is False, what="the client to see the agent unreachable")
    finally:
        threading.Timer(0.5, agent.resume).start()
    client.close(timeout_s=scaled(10))
    assert client.ended
    assert job_ids(agent) == set()


def test_channel_targets() -> None:
    assert channel_target("/run/flexcomm/agent.sock") == "unix:/run/flexcomm/agent.sock"
    assert channel_target("unix:/x") == "unix:/x"
    assert channel_target("10.0.0.1:7070") == "10.0.0.1:7070"
