"""Every RPC validates its input against a real agent process: each kind of bad
field gets INVALID_ARGUMENT (or NOT_FOUND for an unknown job) naming the field,
refused requests change nothing, and thousands of random requests leave the
agent healthy with its store intact."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexcomm.policy.gravac import GravacConfig
from flexcomm.policy.moo import MooConfig
from flexcomm.policy.static import StaticConfig
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Store
from support.agent_process import AgentProcess, spec

OK_REPORT = {"step": 1, "family": "dense", "collective": pb.COLLECTIVE_DENSE_RING, "t_sync_s": 0.1, "gain": 1.0}
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED}
FIELD_PATH = re.compile(r"^(spec|job_id|reports|network)[\w\[\].]*: ")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    proc = AgentProcess(tmp_path_factory.mktemp("agent"))
    try:
        proc.start()
        proc.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("canary", policy="moo")), timeout=5)
        proc.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("fz-moo", policy="moo")), timeout=5)
        yield proc
    finally:
        proc.stop()


def code_and_details(call) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def register(agent: AgentProcess, **fields: object):
    return lambda: agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec(**fields)), timeout=5)


def report(agent: AgentProcess, *messages: pb.ReportStepsRequest):
    return lambda: agent.stub.ReportSteps(iter(messages), timeout=5)


def steps(job_id: str = "canary", network: dict | None = None, **fields: object) -> pb.ReportStepsRequest:
    msg = pb.ReportStepsRequest(job_id=job_id, reports=[pb.StepReport(**{**OK_REPORT, **fields})])
    if network is not None:
        msg.network.CopyFrom(pb.NetworkEstimate(**network))
    return msg


BAD_REGISTRATIONS = [
    ({"job_id": ""}, "spec.job_id"),
    ({"job_id": "has space"}, "spec.job_id"),
    ({"job_id": "x" * 129}, "spec.job_id"),
    ({"world_size": 1}, "spec.world_size"),
    ({"world_size": 2**32 - 1}, "spec.world_size"),
    ({"grad_bytes": 0}, "spec.grad_bytes"),
    ({"grad_bytes": 2**60}, "spec.grad_bytes"),
    ({"nodes": ["10.0.0.1", "not a host!"]}, "spec.nodes[1]"),
    ({"nodes": ["10.0.0.1", "10.0.0.1"]}, "spec.nodes"),
    ({"nodes": [f"10.0.{i // 250}.{i % 250}" for i in range(5000)]}, "spec.nodes"),
    ({"policy": "fastest"}, "spec.policy"),
    ({"policy": ""}, "spec.policy"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_REGISTRATIONS)
def test_bad_registration_names_the_field(agent: AgentProcess, fields: dict, field: str) -> None:
    code, details = code_and_details(register(agent, **{"job_id": "new-job", **fields}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}: "), details


@pytest.mark.parametrize(("options", "field"), [
    ({"c_low": float("nan")}, "spec.options.c_low"),
    ({"no_such_option": 1}, "spec.options.no_such_option"),
    ({"c_low": 5}, "spec.options.c_low"),
    ({"weight_time": -1}, "spec.options.weight_time"),
    ({"padding": "x" * 20_000}, "spec.options"),
])
def test_bad_policy_options_name_the_option(agent: AgentProcess, options: dict, field: str) -> None:
    request = pb.RegisterJobRequest(spec=spec("opt-job"))
    request.spec.options.update(options)
    code, details = code_and_details(lambda: agent.stub.RegisterJob(request, timeout=5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}: ") or details.startswith(f"{field}."), details


def test_missing_spec_and_conflicting_spec(agent: AgentProcess) -> None:
    code, details = code_and_details(lambda: agent.stub.RegisterJob(pb.RegisterJobRequest(), timeout=5))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "spec: missing")
    # canary is running with another world: refused, naming the id and what differs
    code, details = code_and_details(register(agent, job_id="canary", world_size=4))
    assert code == grpc.StatusCode.ALREADY_EXISTS, details
    assert details.startswith("spec.job_id: job 'canary' is running with another world_size"), details


BAD_REPORTS = [
    ({"t_sync_s": math.nan}, "reports[0].t_sync_s"),
    ({"t_sync_s": math.inf}, "reports[0].t_sync_s"),
    ({"t_comp_s": -0.5}, "reports[0].t_comp_s"),
    ({"t_compute_s": 1e9}, "reports[0].t_compute_s"),
    ({"ended_unix": -1.0}, "reports[0].ended_unix"),
    ({"ended_unix": math.nan}, "reports[0].ended_unix"),
    ({"family": "topk", "param": 0.0, "collective": pb.COLLECTIVE_AG_TOPK}, "reports[0].param"),
    ({"family": "topk", "param": 1.5, "collective": pb.COLLECTIVE_AG_TOPK}, "reports[0].param"),
    ({"family": "topk", "param": math.nan, "collective": pb.COLLECTIVE_AG_TOPK}, "reports[0].param"),
    ({"family": "powersgd", "param": 2.5}, "reports[0].param"),
    ({"family": "powersgd", "param": 2, "collective": pb.COLLECTIVE_AG_TOPK}, "reports[0].collective"),
    ({"family": "dense", "param": 0.5}, "reports[0].param"),
    ({"family": ""}, "reports[0].family"),
    ({"family": "zip"}, "reports[0].family"),
    ({"collective": pb.COLLECTIVE_UNSPECIFIED}, "reports[0].collective"),
    ({"collective": 42}, "reports[0].collective"),
    ({"gain": 1.5}, "reports[0].gain"),
    ({"gain": -math.inf}, "reports[0].gain"),
    ({"step": 2**60}, "reports[0].step"),
    ({"epoch": 2**63}, "reports[0].epoch"),
    ({"bytes_sent": 2**62}, "reports[0].bytes_sent"),
    ({"gains": [pb.Gain(compression="topk:2", gain=0.5)]}, "reports[0].gains"),
    ({"gains": [pb.Gain(compression="bf16", gain=0.5)]}, "reports[0].gains"),
    ({"gains": [pb.Gain(compression="x" * 100, gain=0.5)]}, "reports[0].gains[0].compression"),
    ({"gains": [pb.Gain(compression="topk:0.1", gain=math.nan)]}, "reports[0].gains[0].gain"),
    ({"gains": [pb.Gain(compression="topk:0.5", gain=0.5)] * 65}, "reports[0].gains"),
    ({"network": {"alpha_s": 1e-4, "bandwidth_bps": 0.0}}, "network.bandwidth_bps"),
    ({"network": {"alpha_s": math.nan, "bandwidth_bps": 1e9}}, "network.alpha_s"),
    ({"network": {"alpha_s": 1e-4, "bandwidth_bps": 1e30}}, "network.bandwidth_bps"),
    ({"network": {"alpha_s": 1e-4, "bandwidth_bps": 5e-324}}, "network.bandwidth_bps"),
    ({"job_id": "bad id"}, "job_id"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_REPORTS)
def test_bad_report_names_the_field_and_changes_nothing(agent: AgentProcess, fields: dict,
                                                        field: str) -> None:
    before = agent.stub.GetDecision(pb.JobRef(job_id="canary"), timeout=5)
    code, details = code_and_details(report(agent, steps(**fields)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}: "), details
    jobs = {j.spec.job_id: j for j in agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs}
    assert jobs["canary"].reports == 0 and jobs["canary"].decision == before


def test_a_bad_report_in_a_batch_refuses_the_whole_batch(agent: AgentProcess) -> None:
    msg = steps(job_id="canary")
    msg.reports.append(pb.StepReport(**{**OK_REPORT, "t_sync_s": -1.0}))
    code, details = code_and_details(report(agent, msg))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("reports[1].t_sync_s: ")
    assert agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs[0].reports == 0


def test_too_many_reports_in_one_message(agent: AgentProcess) -> None:
    msg = pb.ReportStepsRequest(job_id="canary", reports=[pb.StepReport(**OK_REPORT)] * 5000)
    code, details = code_and_details(report(agent, msg))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("reports: ")


def test_oversized_message_is_refused_by_the_transport(agent: AgentProcess) -> None:
    request = pb.RegisterJobRequest(spec=spec("huge"))
    request.spec.options.update({"blob": "x" * (5 * 1024 * 1024)})
    code, _ = code_and_details(lambda: agent.stub.RegisterJob(request, timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert agent.health() == 1


def test_unknown_jobs_are_not_found(agent: AgentProcess) -> None:
    stub = agent.stub
    calls = [
        lambda: stub.GetDecision(pb.JobRef(job_id="ghost"), timeout=5),
        lambda: stub.GetNetwork(pb.GetNetworkRequest(job_id="ghost"), timeout=5),
        lambda: next(stub.WatchDecisions(pb.WatchDecisionsRequest(job_id="ghost"), timeout=5)),
        report(agent, steps(job_id="ghost")),
    ]
    for call in calls:
        code, details = code_and_details(call)
        assert (code, details) == (grpc.StatusCode.NOT_FOUND, "job_id: no job 'ghost' is registered")
    code, details = code_and_details(lambda: stub.GetDecision(pb.JobRef(job_id=""), timeout=5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("job_id: ")
    code, details = code_and_details(report(agent))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("job_id: ")


# -- random requests ----------------------------------------------------------------
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.0, 0.5]))
u64 = st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 10))
u32 = st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 8))
enums = st.integers(-3, 12)
job_ids = st.one_of(st.sampled_from(["fz-1", "fz-2", "ghost", ""]), st.text(max_size=140)).filter(
    lambda s: s != "canary")
# Every option of every policy, with values of every kind: wrong types, numbers
# at the edges (a factor near 1 once asked for a 46-million-ratio grid), lists
# with repeats.
OPTION_NAMES = sorted({f.name for config in (MooConfig, GravacConfig, StaticConfig) for f in fields(config)}
                      | {"whatever"})
edge_numbers = st.sampled_from([1.0000001, 1.001, 1e-300, 5e-324, 1e308, -0.0, 0.5, 3, 0, -1, 2**53])
option_values = st.one_of(floats, edge_numbers, st.integers(-10, 10**6), st.text(max_size=20), st.booleans(),
                          st.sampled_from(["0.5", "ag_topk,ag_topk", "asf", "star", "paper"]),
                          st.lists(st.sampled_from(["ag_topk", "art_ring", "dense_ring", "bogus"]), max_size=4),
                          st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
options = st.dictionaries(st.sampled_from(OPTION_NAMES), option_values, max_size=4)

registrations = st.builds(
    lambda job_id, world, grad, nodes, policy, opts: pb.RegisterJobRequest(spec=_spec(
        job_id, world, grad, nodes, policy, opts)),
    job_ids, u32, u64, st.lists(st.sampled_from(["10.0.0.1", "10.0.0.2", "h!", ""]), max_size=3),
    st.sampled_from(["dense", "static", "moo", "gravac", "x"]), options)


def _spec(job_id, world, grad, nodes, policy, opts) -> pb.JobSpec:
    msg = pb.JobSpec(job_id=job_id, world_size=world, grad_bytes=grad, nodes=nodes, policy=policy)
    msg.options.update(opts)
    return msg


families = st.sampled_from(["dense", "bf16", "powersgd", "topk", "", "zip"])
compressions = st.one_of(st.sampled_from(["topk:0.1", "powersgd:2", "bf16", "topk:2"]), st.text(max_size=12))
step_reports = st.builds(
    pb.StepReport, step=u64, epoch=u64, family=families, param=floats, collective=enums, t_comp_s=floats,
    t_sync_s=floats, t_compute_s=floats, gain=floats, bytes_sent=u64,
    gains=st.lists(st.builds(pb.Gain, compression=compressions, gain=floats), max_size=3))
# Valid but odd reports: they reach the policy (a compression it never chose, ...).
unit = st.floats(0, 1)
plausible_reports = st.one_of(
    st.builds(pb.StepReport, step=st.integers(0, 10**6), epoch=st.integers(0, 100), family=st.just("topk"),
              param=st.floats(1e-6, 0.99), collective=st.integers(4, 6), t_comp_s=st.floats(0, 5),
              t_sync_s=st.floats(0, 5), t_compute_s=st.floats(0, 5), gain=unit, bytes_sent=st.integers(0, 10**9),
              gains=st.lists(st.builds(pb.Gain, compression=st.sampled_from(["topk:0.1", "powersgd:1"]),
                                       gain=unit), max_size=2)),
    st.builds(pb.StepReport, step=st.integers(0, 10**6), family=st.sampled_from(["dense", "bf16"]),
              collective=st.integers(2, 3), t_sync_s=st.floats(0, 5), t_compute_s=st.floats(0, 5), gain=unit),
    st.builds(pb.StepReport, step=st.integers(0, 10**6), family=st.just("powersgd"), param=st.integers(1, 64),
              collective=st.just(2), t_sync_s=st.floats(0, 5), t_compute_s=st.floats(0, 5), gain=unit))
report_messages = st.builds(
    lambda job_id, reports, net: _report_message(job_id, reports, net),
    st.one_of(job_ids, st.just("fz-1"), st.just("fz-moo")),
    st.lists(st.one_of(step_reports, plausible_reports), max_size=4),
    st.none() | st.builds(pb.NetworkEstimate, alpha_s=floats, bandwidth_bps=floats)
    | st.builds(pb.NetworkEstimate, alpha_s=st.floats(0, 1), bandwidth_bps=st.floats(1, 1e12)))


def _report_message(job_id, reports, net) -> pb.ReportStepsRequest:
    msg = pb.ReportStepsRequest(job_id=job_id, reports=reports)
    if net is not None:
        msg.network.CopyFrom(net)
    return msg


requests = st.one_of(
    registrations.map(lambda r: ("RegisterJob", r)),
    st.lists(report_messages, min_size=1, max_size=3).map(lambda r: ("ReportSteps", r)),
    job_ids.map(lambda j: ("GetDecision", pb.JobRef(job_id=j))),
    job_ids.map(lambda j: ("GetNetwork", pb.GetNetworkRequest(job_id=j))),
    st.builds(pb.WatchDecisionsRequest, job_id=st.one_of(job_ids, st.just("fz-moo")), after_version=u64).map(
        lambda r: ("WatchDecisions", r)),
    st.just(("ListJobs", pb.ListJobsRequest())),
)


def first_decision(stream) -> None:
    """A watch answers at once with the decision when it is newer than after_version,
    else waits for a change: either is an answer; the stream is then cancelled."""
    try:
        next(stream)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    finally:
        stream.cancel()


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=True)
@given(request=requests)
def test_random_requests_never_break_the_agent(agent: AgentProcess, request) -> None:
    method, message = request
    stub = agent.stub
    call = {
        "RegisterJob": lambda: stub.RegisterJob(message, timeout=10),
        "ReportSteps": lambda: stub.ReportSteps(iter(message), timeout=10),
        "GetDecision": lambda: stub.GetDecision(message, timeout=10),
        "GetNetwork": lambda: stub.GetNetwork(message, timeout=10),
        "WatchDecisions": lambda: first_decision(stub.WatchDecisions(message, timeout=0.1)),
        "ListJobs": lambda: stub.ListJobs(message, timeout=10),
    }[method]
    start = time.monotonic()
    code, details = code_and_details(call)
    assert time.monotonic() - start < 5, f"{method} took {time.monotonic() - start:.1f} s"
    assert code in ALLOWED, f"{method} -> {code.name}: {details}"
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.ALREADY_EXISTS):
        assert FIELD_PATH.match(details), f"{method}: {details!r} does not start with a field"


def test_after_the_storm_the_agent_is_healthy_and_its_store_intact(agent: AgentProcess) -> None:
    # Runs after the random requests (pytest keeps file order).
    assert agent.health() == 1
    canary = agent.stub.GetDecision(pb.JobRef(job_id="canary"), timeout=5)
    assert canary.version == 1
    fed = {j.spec.job_id: j for j in agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs}
    assert fed["fz-moo"].reports > 0, "some random reports were valid and reached the policy"
    stored_jobs = {j.spec.job_id for j in agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs}
    agent.terminate()
    with Store(Path(agent.db)) as store:
        assert "canary" in {j.job_id for j in store.jobs()}
        assert {j.job_id for j in store.jobs()} == stored_jobs
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert store.load_policy_state("canary")["decision"]["version"] == 1
    agent.start()
    try:
        assert agent.stub.GetDecision(pb.JobRef(job_id="canary"), timeout=5).version == 1
    finally:
        agent.stop()  # started by this test: ended by it (the module's fixture ended the first)
