"""The Agent gRPC service (proto/flexcomm/v1/agent.proto) on grpc.aio.

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

from flexcomm.agent.jobs import Job, JobNotFound, Jobs
from flexcomm.agent.metrics import Metrics
from flexcomm.agent.network_feed import JobNetwork, NetworkFeed
from flexcomm.agent.persist import Persister
from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.types import Policy, StepReport
from flexcomm.probe.estimate import PeerPath
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc
from flexcomm.proto import validate
from flexcomm.proto.convert import decision_to_proto
from flexcomm.store import BANDWIDTH, LATENCY

log = logging.getLogger("flexcomm.agent.service")
# Reports fed to a policy between two turns of the event loop (a 4,096-report
# message would otherwise hold every other RPC).
INGEST_SLICE = 512


class SpecConflict(ValueError):
    """A job id registered again with a different spec (and no `replace`)."""


class StoreUnavailable(Exception):
    """The store could not be written: what the request carried is not acknowledged."""


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


class AgentService(pb_grpc.AgentServicer):
    """`on_epoch(epoch)` is told each new highest epoch a job reports;
    `on_jobs_changed()` runs after each registration and end (e.g. to probe the
    jobs' nodes as they are now)."""

    def __init__(self, jobs: Jobs, network: NetworkFeed, persister: Persister, metrics: Metrics,
                 create_policy: Callable[[JobSpec], Policy],
                 commit: Callable[[], Awaitable[None]],
                 on_epoch: Callable[[int], None] | None = None,
                 on_jobs_changed: Callable[[], Awaitable[None]] | None = None,
                 agent_info: Callable[[], pb.AgentInfo] = pb.AgentInfo) -> None:
        self.jobs = jobs
        # Awaited before a report stream is acknowledged: what it carried is on disk.
        self.commit = commit
        self.network = network
        self.persister = persister
        self.metrics = metrics
        self.instrumented = _Instrumented(metrics)
        self.create_policy = create_policy
        self.on_epoch = on_epoch
        self.on_jobs_changed = on_jobs_changed  # after a job is registered or ended
        self.agent_info = agent_info
        self.on_decision: Callable[[], None] | None = None  # e.g. to write it out soon
        self._report_counters: dict[str, Any] = {}

    # -- helpers used by the server too ----------------------------------------
    def publish(self, job: Job) -> None:
        """The job's current decision into the metrics."""
        self.metrics.decision_cr.labels(job.job_id).set(job.decision.compression.cr)
        self.metrics.decision_version.labels(job.job_id).set(job.version)

    def decision_changed(self, job: Job) -> None:
        self.metrics.count_decision(job.job_id, job.decision.collective)
        self.publish(job)
        if self.on_decision is not None:
            self.on_decision()

    def refresh_network(self, job: Job) -> None:
        """Give the job's policy the current bottleneck (if it changed)."""
        net = self.network.bottleneck(job)
        if net is not None and job.observe_network(net):
            self.decision_changed(job)

    def refresh_job(self, job_id: str) -> None:
        job = self.jobs.find(job_id)
        if job is not None:
            self.refresh_network(job)

    def _policy_error(self, job: Job) -> Callable[[str], None]:
        def on_error(message: str) -> None:
            self.metrics.policy_errors.labels(job.job_id).inc()
            if job.policy_errors == 1:  # say it once per job, count the rest
                log.warning("policy refused a report", extra={"fields": {"job": job.job_id,
                                                                          "error": message}})
        return on_error

    # -- RPCs -----------------------------------------------------------------
    @unary
    async def RegisterJob(self, request: pb.RegisterJobRequest, context: Any) -> pb.RegisterJobResponse:
        if not request.HasField("spec"):
            raise ValueError("spec: missing")
        spec = validate.spec(request.spec)
        existing = self.jobs.find(spec.job_id)
        if existing is not None and existing.spec == spec:
            existing.touch()
            return pb.RegisterJobResponse(job=existing.info(), decision=existing.decision_pb, resumed=True)
        differ = ([k for k, v in spec.to_dict().items() if existing.spec.to_dict()[k] != v]
                  if existing is not None else [])
        if differ and not request.replace:
            raise SpecConflict(f"spec.{differ[0]}: job {spec.job_id!r} is registered with a different "
                               f"{', '.join(differ)}; set replace to start it anew")
        job = Job(spec, self.create_policy(spec))
        self.jobs.check_room(spec.job_id)
        await self.network.add_job(job)
        net = self.network.bottleneck(job)
        if net is not None:
            job.observe_network(net)
        # Written (job row and state in one transaction) before it is held: a job
        # the store did not take is not registered.
        try:
            await self.persister.save_registration(job)
        except Exception as exc:
            await self.network.forget(job, existing)
            raise StoreUnavailable(f"store: the job could not be written ({exc}); register again") from None
        self.jobs.add(job)
        if existing is not None:
            self.metrics.forget_job(spec.job_id)
        self.decision_changed(job)
        self.metrics.jobs.set(len(self.jobs))
        if self.on_jobs_changed is not None:
            await self.on_jobs_changed()
        self.network.probe_if_wanted(job.job_id)  # the prober knows the job's peers now
        log.info("job replaced" if differ else "job registered", extra={"fields": {
            "job": spec.job_id, "policy": spec.policy, "world_size": spec.world_size,
            "nodes": list(spec.nodes), "changed": differ}})
        return pb.RegisterJobResponse(job=job.info(), decision=job.decision_pb, resumed=False,
                                      replaced=bool(differ), changed=differ)

    async def end_job(self, job: Job, reason: str) -> None:
        """Take the job out of the agent (listing, probing, metrics) and write its end:
        `reason` is "ended" (its client said so) or "expired" (idle too long)."""
        self.jobs.remove(job.job_id)
        await self.network.forget(job)
        self.metrics.forget_job(job.job_id)
        self._report_counters.pop(job.job_id, None)
        self.metrics.jobs.set(len(self.jobs))
        await self.write_end(job, reason)
        if self.on_jobs_changed is not None:
            await self.on_jobs_changed()

    async def write_end(self, job: Job, reason: str) -> None:
        """Store that a job (no longer in the agent) ended, with what it had not written."""
        self.metrics.jobs_ended.labels(reason).inc()
        try:
            await self.persister.save_end(job, reason, time.time())
        except Exception as exc:  # the job is out either way; a restart expires it again
            self.metrics.store_errors.inc()
            log.error("store write failed", extra={"fields": {"job": job.job_id, "error": str(exc)}})
        log.info(f"job {reason}", extra={"fields": {
            "job": job.job_id, "last_step": job.last_step, "reports": job.reports,
            "idle_s": round(job.idle_s(time.time()), 3), "version": job.version}})

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
            reports = validate.reports(request)
            network = validate.network(request.network) if request.HasField("network") else None
            job.touch()
            accepted += await self._ingest(job, reports, network)
        if job is None:
            raise ValueError("job_id: the stream carried no message")
        await _durably(self.commit, f"{accepted} report(s)")
        return pb.ReportStepsResponse(accepted=accepted, decision=job.decision_pb)

    async def _ingest(self, job: Job, reports: list[StepReport], network: tuple[float, float] | None) -> int:
        """One message's reports: to the policy (in slices, the loop serving others
        between them), to the network model as one observation per option, then
        one decision."""
        epoch_before, received = job.last_epoch, time.time()
        reports = self.network.disturbed(job, reports, received)
        n = 0
        for start in range(0, len(reports), INGEST_SLICE):
            if start:
                await asyncio.sleep(0)
            n += job.ingest(reports[start:start + INGEST_SLICE], self._policy_error(job))
        if n:
            counter = self._report_counters.get(job.job_id)
            if counter is None:
                counter = self._report_counters[job.job_id] = self.metrics.reports.labels(job.job_id)
            counter.inc(n)
            self.metrics.observe_steps(job.job_id, reports)
            error = job.policy.model_error()
            if error is not None:
                self.metrics.model_error.labels(job.job_id).set(error)
        news = network if network is not None and network != job.reported_network else None
        if news is not None:
            job.reported_network = news
            job.dirty = True
        if job.closed:
            return n  # ended while its reports were ingested
        self.network.reported(job, reports, news, received)
        self.refresh_network(job)
        if job.redecide():
            self.decision_changed(job)
        if job.last_epoch > epoch_before and self.on_epoch is not None:
            self.on_epoch(job.last_epoch)
        return n

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
        return pb.ListJobsResponse(jobs=[job.info() for job in self.jobs])

    @unary
    async def EndJob(self, request: pb.EndJobRequest, context: Any) -> pb.EndJobResponse:
        job = self.jobs.get(validate.job_id(request.job_id))
        await self.end_job(job, "ended")
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
                                  updated_unix=e.moved_at or 0.0))
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
