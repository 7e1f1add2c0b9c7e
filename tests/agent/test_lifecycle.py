"""A job's life at a real agent process: it ends when its client says so or its
process exits, expires when nobody hears from it, is replaced when its spec
changes (but never taken by another world while it runs), is refused loudly at
max_jobs, and a restarted agent resumes only the running ones. Ended jobs leave
the agent (listing, probing, metrics) while their history stays in the store. A
replacement the store refused leaves the running job its estimate (in-process)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from flexcomm.agent.jobs import Job, Jobs
from flexcomm.agent.lifecycle import INGEST_SLICE, JobLifecycle, StoreUnavailable
from flexcomm.agent.metrics import Metrics
from flexcomm.agent.network_feed import NetworkFeed
from flexcomm.agent.persist import Persister
from flexcomm.client.agent_client import AgentClient
from flexcomm.policy.jobspec import JobSpec, policy_for
from flexcomm.policy.types import StepReport
from flexcomm.probe.estimate import Estimator
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Measurement, Store
from support.agent_process import AgentProcess, free_port, job_ids, metrics_text, running, spec, wait_for
from support.waiting import scaled

GRAD_BYTES = 4_000_000


def report(step: int) -> pb.StepReport:
    return pb.StepReport(step=step, family="dense", collective=pb.COLLECTIVE_DENSE_RING, t_comp_s=0.002,
                         t_sync_s=0.05, t_compute_s=0.1, gain=1.0, bytes_sent=GRAD_BYTES)


def register(agent: AgentProcess, job_id: str, **kw: object) -> None:
    agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec(job_id, grad_bytes=GRAD_BYTES, **kw)), timeout=5)


def send(agent: AgentProcess, job_id: str, steps: range) -> None:
    agent.stub.ReportSteps(iter([pb.ReportStepsRequest(job_id=job_id, reports=[report(s) for s in steps])]),
                           timeout=5)


def client(agent: AgentProcess, job_id: str, **kw: object) -> AgentClient:
    return AgentClient(agent.socket, job_id=job_id, world_size=kw.pop("world_size", 2), grad_bytes=GRAD_BYTES,
                       nodes=["127.0.0.1"], timeout_s=1.0, poll_interval_s=0.1, retry_max_s=0.3, **kw)


def test_an_ended_job_leaves_the_agent_and_keeps_its_history(tmp_path: Path) -> None:
    with running(tmp_path) as agent:
        register(agent, "done")
        register(agent, "other")
        send(agent, "done", range(0, 5))
        send(agent, "other", range(0, 5))
        body = metrics_text(agent)
        assert 'flexcomm_agent_job_sync_seconds{job="done"} 0.05' in body
        step = re.search(r'flexcomm_agent_job_step_seconds\{job="done"\} ([0-9.e-]+)', body)
        assert step and float(step.group(1)) == pytest.approx(0.152)  # 0.1 compute + 0.002 + 0.05
        assert 'flexcomm_agent_job_collective{collective="dense_ring",compression="dense",job="done"} 1.0' in body

        ended = agent.stub.EndJob(pb.EndJobRequest(job_id="done"), timeout=5)
        assert ended.job.reports == 5 and ended.job.last_step == 4
        assert job_ids(agent) == {"other"}
        with pytest.raises(grpc.RpcError) as again:
            agent.stub.EndJob(pb.EndJobRequest(job_id="done"), timeout=5)
        assert again.value.code() == grpc.StatusCode.NOT_FOUND
        body = metrics_text(agent)
        assert 'job="done"' not in body and 'flexcomm_agent_job_sync_seconds{job="other"}' in body
        assert 'flexcomm_agent_jobs_ended_total{reason="ended"} 1.0' in body
        assert "flexcomm_agent_jobs 1.0" in body
        with Store(agent.db, create=False) as store:
            record = store.job("done")
            assert record.end_reason == "ended" and not record.running and store.job("other").running
            assert sum(a.count for a in store.step_reports("done")) == 5  # written at the end
            assert store.decisions("done")


def test_idle_jobs_expire_and_a_job_that_polls_does_not(tmp_path: Path) -> None:
    with running(tmp_path, "--job-idle-expiry", "1s") as agent:
        register(agent, "idle")
        register(agent, "alive")
        def idle_gone() -> bool:
            agent.stub.GetDecision(pb.JobRef(job_id="alive"), timeout=5)  # as AgentClient polls
            return "idle" not in job_ids(agent)

        def idle_end_stored() -> bool:
            with Store(agent.db, create=False) as store:
                return store.job("idle").end_reason == "expired"

        wait_for(idle_gone, 20, "the idle job's expiry", interval_s=0.1)
        assert job_ids(agent) == {"alive"}
        assert 'flexcomm_agent_jobs_ended_total{reason="expired"} 1.0' in metrics_text(agent)
        # The job leaves the listing, then its end is written (a loaded CI run read
        # the store between the two)
        wait_for(idle_end_stored, 20, "the idle job's end in the store", interval_s=0.1)
        with Store(agent.db, create=False) as store:
            assert store.job("alive").running


def probed_peers(log: str) -> list[list[str]]:
    """The node sets the agent said it follows, in order: the peers it probes and
    its own addresses it leaves out (127.0.0.x are this host's)."""
    lines = [json.loads(line) for line in log.splitlines() if '"msg": "probing"' in line]
    return [sorted(x["peers"] + x["own_addresses_skipped"]) for x in lines]


def test_a_restarted_agent_resumes_only_running_jobs_and_probes_only_their_nodes(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, "--probe-port", str(free_port()), probe=True).start()
    try:
        register(agent, "ended", nodes=["127.0.0.2"])
        register(agent, "stale", nodes=["127.0.0.3"])
        register(agent, "running", nodes=["127.0.0.4"])
        agent.stub.EndJob(pb.EndJobRequest(job_id="ended"), timeout=5)
        assert probed_peers(agent.log.read_text())[-1] == ["127.0.0.3", "127.0.0.4"]
        with Store(agent.db, create=False) as store:
            wait_for(lambda: store.load_policy_state("stale") is not None, what="stale's state stored")
        agent.kill9()
        with Store(agent.db, create=False) as store:  # as if stale's client died an hour ago
            state = store.load_policy_state("stale")
            for key in ("last_seen_unix", "registered_unix"):
                state[key] -= 3600
            store.save_policy_state("stale", state)
        before = len(agent.log.read_text())
        agent.start()
        assert job_ids(agent) == {"running"}
        with Store(agent.db, create=False) as store:
            assert store.job("stale").end_reason == "expired" and store.job("ended").end_reason == "ended"
        wait_for(lambda: probed_peers(agent.log.read_text()[before:]), what="probing started")  # after SERVING
        assert probed_peers(agent.log.read_text()[before:]) == [["127.0.0.4"]]
    finally:
        agent.stop()


def test_max_jobs_is_a_loud_error_naming_the_limit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with running(tmp_path, env={"FLEXCOMM_AGENT_MAX_JOBS": "1"}) as agent:
        first = client(agent, "first")
        wait_for(lambda: job_ids(agent) == {"first"}, what="the first job")
        with caplog.at_level(logging.ERROR, logger="flexcomm.client.agent"):
            second = client(agent, "second")
            try:
                wait_for(lambda: second.refusal is not None, what="the refusal")
                assert "max_jobs=1" in second.refusal
                errors = [r for r in caplog.records if r.levelno == logging.ERROR]
                assert len(errors) == 1 and "max_jobs=1" in errors[0].getMessage()
                first.close()  # ends "first": a slot frees and "second" takes it
                wait_for(lambda: second.refusal is None and second.latest() is not None, what="second registered")
                assert job_ids(agent) == {"second"}
            finally:
                second.close()


def logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


def test_a_running_job_id_is_refused_to_another_world_and_replaced_only_by_its_own(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with running(tmp_path) as agent:
        old = client(agent, "reused", world_size=2)
        wait_for(lambda: old.latest() is not None, what="the first registration")
        # the client counts a refusal just before it logs it: wait for the log line
        with caplog.at_level(logging.ERROR, logger="flexcomm.client.agent"):
            other = client(agent, "reused", world_size=4)
            wait_for(lambda: logged(caplog, "ALREADY_EXISTS"), what="the other world's refusal")
        other.close()
        refusal = next(r.getMessage() for r in caplog.records if "ALREADY_EXISTS" in r.getMessage())
        assert "'reused' is running with another world_size" in refusal
        infos = agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs
        assert [j.spec.world_size for j in infos] == [2]  # not merged, not replaced
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="flexcomm.client.agent"):
            kept = client(agent, "reused", world_size=2, policy="gravac", replace=False)
            wait_for(lambda: logged(caplog, "set replace"), what="a refusal saying to set replace")
        assert kept.refused_batches > 0
        with caplog.at_level(logging.INFO, logger="flexcomm.client.agent"):
            new = client(agent, "reused", world_size=2, policy="gravac")
            wait_for(lambda: new.latest() is not None, what="the replacing registration")
        replaced = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
        assert replaced and "policy" in replaced[0]
        assert [j.spec.policy for j in agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs] == ["gravac"]
        for c in (kept, old, new):
            c.close()


def test_a_restart_in_another_world_takes_the_id_once_the_old_job_went_quiet(tmp_path: Path) -> None:
    with running(tmp_path) as agent:
        register(agent, "restarted", world_size=2)  # then silent, as a job killed outright
        new = client(agent, "restarted", world_size=4)
        try:
            wait_for(lambda: new.latest() is not None, timeout_s=60, what="the restart's registration")
            infos = agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs
            assert [j.spec.world_size for j in infos] == [4]
        finally:
            new.close()


EXITING_JOB = """
import sys, time
from flexcomm.client.agent_client import AgentClient
from flexcomm.policy.types import StepReport
c = AgentClient(sys.argv[1], job_id="exits", world_size=2, grad_bytes=4_000_000, nodes=["127.0.0.1"],
                poll_interval_s=0.1)
for i in range(20):
    c.report(StepReport(step=i, family="dense", param=0.0, collective="dense_ring", t_comp_s=0.0, t_sync_s=0.01,
                        gain=1.0))
while c.latest() is None:  # the test's own timeout bounds this
    time.sleep(0.02)
print("registered", flush=True)
# no close(): the interpreter's exit ends the job
"""


def test_a_process_that_exits_without_close_ends_its_job(tmp_path: Path) -> None:
    with running(tmp_path) as agent:
        proc = subprocess.run([sys.executable, "-c", EXITING_JOB, agent.socket], capture_output=True,
                              text=True, timeout=scaled(60))
        assert proc.returncode == 0 and "registered" in proc.stdout, proc.stderr
        assert job_ids(agent) == set()  # ended before the process was gone
        with Store(agent.db, create=False) as store:
            assert store.job("exits").end_reason == "ended"
            assert sum(a.count for a in store.step_reports("exits")) == 20


def test_history_and_agent_info(tmp_path: Path) -> None:
    with running(tmp_path) as agent:
        register(agent, "hist", nodes=["10.9.0.2"])
        agent.stub.ReportSteps(iter([pb.ReportStepsRequest(
            job_id="hist", reports=[report(0)], network=pb.NetworkEstimate(alpha_s=1e-3, bandwidth_bps=1e8))]),
            timeout=5)
        with Store(agent.db, create=False) as store:  # what the probe scheduler stores
            for i, bw in enumerate((9e8, 5e8, 1e8)):
                store.add_measurement(Measurement(peer="10.9.0.2", kind="bandwidth", bandwidth_bps=bw,
                                                  ts=1000.0 + i))
                store.add_measurement(Measurement(peer="10.9.0.2", kind="latency", rtt_p50_s=1e-3 * (i + 1),
                                                  ts=1000.5 + i))
            store.add_measurement(Measurement(peer="10.9.0.2", kind="bandwidth", ok=False, error="refused",
                                              ts=1003.0))
        wait_for(lambda: len(agent.stub.GetHistory(pb.GetHistoryRequest(job_id="hist"), timeout=5)
                             .decisions) >= 1, what="the decisions written")
        history = agent.stub.GetHistory(pb.GetHistoryRequest(job_id="hist", limit=2), timeout=5)
        peer = history.peers[0]
        assert peer.address == "10.9.0.2"
        assert [s.value for s in peer.bandwidth_bps] == [5e8, 1e8]  # the newest two, oldest first
        assert [s.value for s in peer.rtt_s] == [2e-3, 3e-3]
        with pytest.raises(grpc.RpcError) as bad:
            agent.stub.GetHistory(pb.GetHistoryRequest(job_id="hist", limit=5000), timeout=5)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit" in bad.value.details()
        info = agent.stub.GetAgentInfo(pb.GetAgentInfoRequest(), timeout=5)
        assert {(x.kind, x.address) for x in info.listeners} == {
            ("api", f"unix:{agent.socket}"), ("metrics", f"127.0.0.1:{agent.metrics_port}")}
        assert info.max_jobs == 1024 and info.job_idle_expiry_s == 600 and info.pid == agent.proc.pid


def test_short_jobs_in_a_row_leave_only_the_running_one_listed() -> None:
    """bench/job_lifecycle.py (100 jobs there), on a few."""
    bench = Path(__file__).resolve().parents[2] / "bench" / "job_lifecycle.py"
    proc = subprocess.run([sys.executable, str(bench), "--jobs", "4", "--steps", "5"], capture_output=True,
                          text=True, timeout=scaled(120))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["goal_met"] and result["status_jobs"] == ["long"] and result["with_history"] == 4


def test_a_replacement_the_store_refused_leaves_the_running_job_its_estimate(tmp_path: Path, monkeypatch) -> None:
    """In-process (a real store and network model): the replacing registration's
    write fails. While it is being written and after, the running job's reports
    feed the estimate it had, which keeps what it learned."""
    async def scenario() -> None:
        persister = Persister(str(tmp_path / "a.db"))
        await persister.open()
        jobs = Jobs(4)
        network = NetworkFeed(Estimator(), Metrics(), redecide=lambda _: None)
        lifecycle = JobLifecycle(jobs, network, persister, Metrics(), policy_for)
        first = JobSpec(job_id="j", world_size=2, grad_bytes=4_000_000, nodes=("10.99.0.1", "10.99.0.2"),
                        policy="dense")
        running_job = (await lifecycle.register(first, replace=False)).job
        steps = [StepReport(step=i, family="dense", param=0.0, collective="dense_ring", t_comp_s=0.0,
                            t_sync_s=0.05, gain=1.0) for i in range(8)]
        await lifecycle.ingest(running_job, steps, None)
        estimate = network.estimator.jobs["j"]
        learned = estimate.state_dict()
        assert estimate.beta_s_per_byte is not None and running_job.estimate is estimate
        held_while_written = []

        def disk_full(*args: object, **kwargs: object) -> None:
            held_while_written.append(network.estimator.jobs["j"] is estimate)
            raise OSError("disk full")

        monkeypatch.setattr(persister.store, "save_policy_state", disk_full)
        with pytest.raises(StoreUnavailable, match="disk full"):
            await lifecycle.register(dataclasses.replace(first, grad_bytes=8_000_000), replace=True)
        assert held_while_written == [True]
        assert jobs.find("j") is running_job and network.estimator.jobs["j"] is estimate
        assert estimate.state_dict() == learned
        await persister.close()

    asyncio.run(scenario())


async def one_moo_job(tmp_path: Path) -> tuple[Persister, JobLifecycle, Job]:
    """In-process: a real store and network model, and a MOO job registered on
    two nodes with no network known."""
    persister = Persister(str(tmp_path / "a.db"))
    await persister.open()
    network = NetworkFeed(Estimator(), Metrics(), redecide=lambda _: None)
    lifecycle = JobLifecycle(Jobs(4), network, persister, Metrics(), policy_for)
    spec = JobSpec(job_id="j", world_size=2, grad_bytes=4_000_000, nodes=("10.99.0.1", "10.99.0.2"),
                   policy="moo")
    return persister, lifecycle, (await lifecycle.register(spec, replace=False)).job


def test_a_jobs_first_exploration_is_planned_on_the_network_its_first_report_showed(tmp_path: Path) -> None:
    """In-process (a real store and network model): a MOO job registered with no
    network known. Its first report's syncs give the estimate, and the policy sees
    that network before the report ends its warm-up: the exploration is ranked by
    the model, not the blind plan of one option per family."""
    async def scenario() -> None:
        persister, lifecycle, job = await one_moo_job(tmp_path)
        assert job.policy.network is None
        warm_up = StepReport(step=0, family="dense", param=0.0, collective="dense_ring", t_comp_s=0.0,
                             t_sync_s=0.35, gain=1.0)  # 4 MB in 0.35 s: about 100 Mbit/s
        await lifecycle.ingest(job, [warm_up], None)
        assert job.policy.network is not None
        warm_up_option = job.decision.choice  # the quality reference as a user runs it
        ran = dataclasses.replace(warm_up, family=warm_up_option.compression.family,
                                  param=warm_up_option.compression.param, collective=warm_up_option.collective,
                                  gain=0.8)
        # its compression's set-up step and a timed one
        await lifecycle.ingest(job, [dataclasses.replace(ran, step=1), dataclasses.replace(ran, step=2)], None)
        assert job.policy.phase == "explore" and job.policy.plan.why == "first exploration"
        assert not job.policy.watch.blind  # planned on the network, by the model
        await persister.close()

    asyncio.run(scenario())


def test_a_message_is_fed_a_slice_at_a_time_and_chosen_on_once(tmp_path: Path) -> None:
    """In-process: the policy observes a long message's reports a slice at a
    time (the loop serves others between slices) and chooses on them once,
    after the last (a choice per slice cost a quarter of the ingest rate); the
    network the message showed comes first, with its own choice."""
    async def scenario() -> None:
        persister, lifecycle, job = await one_moo_job(tmp_path)
        chosen_after: list[int] = []
        choose = job.policy.choose
        job.policy.choose = lambda: (chosen_after.append(job.policy.exploring.steps_seen), choose())[1]
        steps = [StepReport(step=i, family="dense", param=0.0, collective="dense_ring", t_comp_s=0.0,
                            t_sync_s=0.35, gain=1.0) for i in range(3 * INGEST_SLICE + 5)]
        assert await lifecycle.ingest(job, steps, None) == len(steps)
        assert chosen_after == [0, len(steps)]
        await persister.close()

    asyncio.run(scenario())


def test_a_registration_its_caller_left_still_holds_the_job_and_the_retry_resumes_it(
        tmp_path: Path, monkeypatch) -> None:
    """In-process (a real store): the store write is slow and the caller leaves
    mid-write (a client past its deadline). The registration runs on: the job is
    held and written, and the client's second try, which waited its turn, resumes
    that job rather than meeting a row not held or racing in a second policy."""
    async def scenario() -> None:
        persister = Persister(str(tmp_path / "a.db"))
        await persister.open()
        jobs = Jobs(4)
        lifecycle = JobLifecycle(jobs, NetworkFeed(Estimator(), Metrics(), redecide=lambda _: None), persister,
                                 Metrics(), policy_for)
        writing, release = asyncio.Event(), asyncio.Event()
        real_save = persister.save_registration

        async def slow_save(job: object) -> None:
            writing.set()
            await release.wait()
            await real_save(job)

        monkeypatch.setattr(persister, "save_registration", slow_save)
        spec = JobSpec(job_id="j", world_size=2, grad_bytes=4_000_000, nodes=("10.99.0.1", "10.99.0.2"),
                       policy="moo")
        first = asyncio.create_task(lifecycle.register(spec, replace=True))
        await writing.wait()
        first.cancel()
        retry = asyncio.create_task(lifecycle.register(spec, replace=True))
        await asyncio.sleep(0.05)
        assert first.cancelled() and not retry.done()  # the retry waits for the first to end
        release.set()
        again = await retry
        assert again.resumed and jobs.find("j") is again.job
        assert [record.job_id for record in persister.store.jobs()] == ["j"]
        assert len(persister.store.decisions("j")) == 1  # written once, by the registration that ran
        await persister.close()

    asyncio.run(scenario())
