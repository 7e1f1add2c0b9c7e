"""The Agent gRPC service (proto/flexcomm/v1/agent.proto) on grpc.aio: it
translates requests into the job lifecycle's calls (agent/lifecycle.py) and their
results into responses, and answers the read-only calls.

Every handler validates its whole request before changing anything (a
ReportSteps stream: each message as a whole, ingested as it arrives, so the
messages before a bad one stay accepted); errors map
to status codes in one place (`_status`): ValueError -> INVALID_ARGUMENT,
JobNotFound -> NOT_FOUND, SpecConflict -> ALREADY_EXISTS, OverflowError ->
RESOURCE_EXHAUSTED, each with the message naming the field; a store that
cannot be written -> UNAVAILABLE (the client sends again). Anything else is a
bug: INTERNAL, logged with its traceback, and the agent carries on.

A ReportSteps stream is acknowledged (its response sent) only once what it
carried is committed to the store, so an acknowledged report survives a kill
-9; a stream that could not be written gets UNAVAILABLE, and its reports,
already fed to the policy, are written with the next flush (a client that
sends them again has them twice: at least once, never lost).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from flexcomm.agent.jobs import JobNotFound, Jobs
from flexcomm.agent.lifecycle import JobLifecycle, SpecConflict, StoreUnavailable, in_turns
from flexcomm.agent.metrics import Metrics
from flexcomm.agent.network_feed import JobNetwork, NetworkFeed
from flexcomm.agent.persist import Persister
from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.types import StepReport
from flexcomm.probe.estimate import PeerPath
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc
from flexcomm.proto import validate
from flexcomm.proto.convert import decision_to_proto, spec_to_proto
from flexcomm.store import BANDWIDTH, LATENCY

log = logging.getLogger("flexcomm.agent.service")
MAX_ENDED_LISTED = 100


def _status(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, JobNotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, StoreUnavailable):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, SpecConflict):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(exc, OverflowError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL


def _message(exc: Exception) -> str:
    return exc.args[0] if isinstance(exc, LookupError) and exc.args else str(exc)


async def _durably(commit: Callable[[], Awaitable[None]], what: str) -> None:
    try:
        await commit()
    except Exception as exc:
        raise StoreUnavailable(f"store: {what} could not be written ({exc}); send again") from None


class _Instrumented:
    """Counts and times RPCs by method and status code (children cached: the
    label lookup is measurable on the GetDecision hot path)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._counters: dict[tuple[str, str], Any] = {}
        self._histograms: dict[str, Any] = {}

    def record(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        key = (method, code.name)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.rpcs.labels(method, code.name)
        counter.inc()
        hist = self._histograms.get(method)
        if hist is None:
            hist = self._histograms[method] = self.metrics.rpc_latency.labels(method)
        hist.observe(seconds)


def unary(fn: Callable) -> Callable:
    """Wrap a unary-response handler: metrics and error mapping."""
    method = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: AgentService, request: Any, context: grpc.aio.ServicerContext) -> Any:
        start = time.perf_counter()
        try:
            response = await fn(self, request, context)
        except Exception as exc:
            code = _status(exc)
            self.instrumented.record(method, code, time.perf_counter() - start)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("internal error", extra={"fields": {"method": method}})
                await context.abort(code, f"internal error in {method}: {type(exc).__name__}")
            await context.abort(code, _message(exc))
        self.instrumented.record(method, grpc.StatusCode.OK, time.perf_counter() - start)
        return response

    return wrapper


def server_stream(fn: Callable) -> Callable:
    """Wrap a streaming-response handler: metrics (time = stream lifetime) and errors."""
    method = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: AgentService, request: Any, context: grpc.aio.ServicerContext) -> Any:
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            async for item in fn(self, request, context):
                yield item
        except Exception as exc:
            code = _status(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("internal error", extra={"fields": {"method": method}})
            await context.abort(code, _message(exc))
        finally:
            self.instrumented.record(method, code, time.perf_counter() - start)

    return wrapper


async def _validated_reports(request: pb.ReportStepsRequest) -> list[StepReport]:
    """A message's reports, all checked before any is taken, a slice a turn of the loop."""
    reports: list[StepReport] = []
    async for part in in_turns(len(request.reports)):
        reports += validate.reports(request, part.start, part.stop)
    return reports


class AgentService(pb_grpc.AgentServicer):
    """The Agent API over `lifecycle` (registration, ingest, end) and what the
    read-only calls read: the jobs, the network feed, the persister's history."""

    def __init__(self, lifecycle: JobLifecycle, jobs: Jobs, network: NetworkFeed, persister: Persister,
                 metrics: Metrics, commit: Callable[[], Awaitable[None]],
                 agent_info: Callable[[], pb.AgentInfo] = pb.AgentInfo) -> None:
        self.lifecycle = lifecycle
        self.jobs = jobs
        # Awaited before a report stream is acknowledged: what it carried is on disk.
        self.commit = commit
        self.network = network
        self.persister = persister
        self.instrumented = _Instrumented(metrics)
        self.agent_info = agent_info
        # One report message checked and ingested at a time, whichever stream it
        # came on: then each turn of the loop holds at most one slice of ingest
        # work, and reads are served between slices rather than behind a burst of
        # streams each running its own slice in the same turn.
        self._ingest_turn = asyncio.Lock()

    # -- RPCs -----------------------------------------------------------------
    @unary
    async def RegisterJob(self, request: pb.RegisterJobRequest, context: Any) -> pb.RegisterJobResponse:
        if not request.HasField("spec"):
            raise ValueError("spec: missing")
        done = await self.lifecycle.register(validate.spec(request.spec), request.replace)
        job = done.job
        return pb.RegisterJobResponse(job=job.info(), decision=job.decision_pb, resumed=done.resumed,
                                      replaced=bool(done.changed), changed=done.changed)

    @unary
    async def GetDecision(self, request: pb.JobRef, context: Any) -> pb.Decision:
        validate.job_id(request.job_id)
        job = self.jobs.get(request.job_id)
        job.touch()
        return job.decision_pb

    @unary
    async def ReportSteps(self, request_iterator: AsyncIterator[pb.ReportStepsRequest],
                          context: Any) -> pb.ReportStepsResponse:
        accepted, job = 0, None
        async for request in request_iterator:
            if request.job_id or job is None:
                job = self.jobs.get(validate.job_id(request.job_id))
            async with self._ingest_turn:
                reports = await _validated_reports(request)
                network = validate.network(request.network) if request.HasField("network") else None
                job.touch()
                accepted += await self.lifecycle.ingest(job, reports, network)
        if job is None:
            raise ValueError("job_id: the stream carried no message")
        await _durably(self.commit, f"{accepted} report(s)")
        return pb.ReportStepsResponse(accepted=accepted, decision=job.decision_pb)

    @server_stream
    async def WatchDecisions(self, request: pb.WatchDecisionsRequest,
                             context: Any) -> AsyncIterator[pb.Decision]:
        job = self.jobs.get(validate.job_id(request.job_id))
        after = request.after_version
        job.watchers += 1  # a job someone watches is not idle
        try:
            while not job.closed:
                if job.version > after:
                    after = job.version
                    yield job.decision_pb
                await job.wait_change(after)
        finally:
            job.watchers -= 1
            job.touch()

    @unary
    async def GetNetwork(self, request: pb.GetNetworkRequest, context: Any) -> pb.NetworkState:
        if not request.job_id:
            return pb.NetworkState(peers=[peer_state(p) for p in self.network.peers()])
        return network_state(self.network.job_network(self.jobs.get(validate.job_id(request.job_id))))

    @unary
    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        jobs = [job.info() for job in self.jobs]
        if request.include_ended:
            jobs += [ended_info(*row) for row in await self.persister.ended_jobs(MAX_ENDED_LISTED)]
        return pb.ListJobsResponse(jobs=jobs)

    @unary
    async def EndJob(self, request: pb.EndJobRequest, context: Any) -> pb.EndJobResponse:
        job = self.jobs.get(validate.job_id(request.job_id))
        await self.lifecycle.end(job, "ended")
        return pb.EndJobResponse(job=job.info())

    @unary
    async def GetHistory(self, request: pb.GetHistoryRequest, context: Any) -> pb.JobHistory:
        job = self.jobs.get(validate.job_id(request.job_id))
        limit = validate.history_limit(request.limit)
        decisions, probes = await self.persister.history(job.job_id, list(job.spec.nodes), limit)
        return pb.JobHistory(
            decisions=[decision_to_proto(r.decision, job.job_id, r.ts or 0.0) for r in decisions],
            peers=[peer_history(address, rows) for address, rows in probes.items()])

    @unary
    async def GetAgentInfo(self, request: pb.GetAgentInfoRequest, context: Any) -> pb.AgentInfo:
        return self.agent_info()


def ended_info(record: Any, last: list, steps: list) -> pb.JobInfo:
    """An ended job as the store keeps it: its spec, last decision and reports."""
    info = pb.JobInfo(spec=spec_to_proto(JobSpec.from_dict(record.spec)), registered_unix=record.created,
                      ended_unix=record.ended or 0.0, end_reason=record.end_reason,
                      reports=sum(s.count for s in steps),
                      last_step=max((s.step_last for s in steps), default=0),
                      last_epoch=max((s.epoch for s in steps), default=0))
    if last:
        info.decision.CopyFrom(decision_to_proto(last[0].decision, record.job_id, last[0].ts or 0.0))
    return info


def peer_history(address: str, rows: list[dict[str, Any]]) -> pb.PeerHistory:
    """A peer's successful probes (store rows, oldest first) as bandwidth and RTT series."""
    out = pb.PeerHistory(address=address)
    for r in rows:
        if r["kind"] == BANDWIDTH and r["bandwidth_bps"]:
            out.bandwidth_bps.add(ts_unix=r["ts"], value=r["bandwidth_bps"])
        elif r["kind"] == LATENCY and r["rtt_p50_s"] is not None:
            out.rtt_s.add(ts_unix=r["ts"], value=r["rtt_p50_s"])
    return out


def network_state(net: JobNetwork) -> pb.NetworkState:
    """A job's network as GetNetwork shows it: its nodes' paths, its estimate, its bottleneck."""
    peers = [peer_state(p, source) for p, source in net.peers]
    e = net.estimate
    if e.beta_s_per_byte:
        peers.append(pb.PeerState(address=f"job:{net.job_id}", bandwidth_bps=e.bandwidth_bps,
                                  beta_s_per_byte=e.beta_s_per_byte, source=e.evidence,
                                  updated_unix=net.moved_unix or 0.0))
    b = net.bottleneck
    if b is None:
        return pb.NetworkState(peers=peers, bottleneck=pb.Bottleneck(nodes=net.nodes))
    return pb.NetworkState(peers=peers, bottleneck=pb.Bottleneck(
        alpha_s=b.alpha_s, beta_s_per_byte=b.beta_s_per_byte, bandwidth_bps=b.bandwidth_bps, nodes=b.nodes,
        known=True, peak_over_rate=b.bucket.peak_over_rate, burst_s=b.bucket.burst_s, evidence=b.evidence))


def peer_state(p: PeerPath, source: str = "probe") -> pb.PeerState:
    """A peer's figures as GetNetwork shows them; `source` "self" for this host's
    own address (never probed)."""
    measured = p.beta_s_per_byte is not None or p.alpha_s is not None
    return pb.PeerState(address=p.address, bandwidth_bps=p.bandwidth_bps or 0.0, rtt_s=p.rtt_s or 0.0,
                        rtt_p99_s=p.rtt_p99_s or 0.0, loss=p.loss or 0.0, alpha_s=p.alpha_s or 0.0,
                        beta_s_per_byte=p.beta_s_per_byte or 0.0,
                        source=source if measured or source == "self" else "none",
                        updated_unix=p.updated or 0.0, probe_failures=p.failures)
