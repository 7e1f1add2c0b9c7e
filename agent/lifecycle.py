"""A job's life in the agent: registration, the ingest of its reports, its end.

The gRPC service (service.py) only translates requests into these calls and
their results into responses. Each call is handed what it changes: the jobs, the
network feed, the persister, the metrics, and callbacks (`on_decision` after a
decision changed, `on_epoch` for each new highest epoch a job reports,
`on_jobs_changed` after each registration and end, e.g. to probe the jobs'
nodes as they are now).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flexcomm.agent.jobs import Job, Jobs
from flexcomm.agent.metrics import Metrics
from flexcomm.agent.network_feed import NetworkFeed
from flexcomm.agent.persist import Persister
from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.types import Policy, StepReport

log = logging.getLogger("flexcomm.agent.lifecycle")
# Reports checked, or fed to a policy, between two turns of the event loop: a
# 4,096-report message would otherwise hold every other RPC. 32 take ~0.5-1 ms
# (bench/agent_load.py: 128 made reads wait behind ~3 ms slices).
INGEST_SLICE = 32


async def in_turns(n: int) -> AsyncIterator[slice]:
    """[0, n) in slices of INGEST_SLICE, the event loop serving others between them."""
    for start in range(0, n, INGEST_SLICE):
        if start:
            await asyncio.sleep(0)
        yield slice(start, start + INGEST_SLICE)


class SpecConflict(ValueError):
    """A job id registered again with a different spec (and no `replace`), or by
    another world while it runs."""


# A client polls every 0.5 s by default: a job heard from this recently is running,
# and another world (other nodes, another world size) may not take its id over.
RUNNING_WITHIN_S = 5.0
WORLD_FIELDS = ("world_size", "nodes")


class StoreUnavailable(Exception):
    """The store could not be written: what the request carried is not acknowledged."""


@dataclass(frozen=True)
class Registration:
    """What a registration did: the job held now, whether it was already held with
    this spec (`resumed`), and the spec's fields that differ from the one replaced."""

    job: Job
    resumed: bool
    changed: list[str]


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class JobLifecycle:
    def __init__(self, jobs: Jobs, network: NetworkFeed, persister: Persister, metrics: Metrics,
                 create_policy: Callable[[JobSpec], Policy]) -> None:
        self.jobs = jobs
        self.network = network
        self.persister = persister
        self.metrics = metrics
        self.create_policy = create_policy
        self.on_epoch: Callable[[int], None] | None = None
        self.on_jobs_changed: Callable[[], Awaitable[None]] | None = None
        self.on_decision: Callable[[], None] | None = None  # e.g. to write it out soon
        self._report_counters: dict[str, Any] = {}
        self._registering = asyncio.Lock()

    # -- decisions ----------------------------------------------------------------
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

    # -- the life of a job ------------------------------------------------------
    async def register(self, spec: JobSpec, replace: bool) -> Registration:
        """Hold the job `spec` describes: the same spec again resumes the job held;
        a different one replaces it only with `replace` (else SpecConflict).

        Registrations run one at a time, each to its end even when its caller
        leaves: a client past its deadline registers again and resumes the job the
        first one held, rather than meeting a job written but not held, or racing
        it into a second policy."""
        task = asyncio.ensure_future(self._register_in_turn(spec, replace))
        task.add_done_callback(_retrieve)  # a caller that left takes no exception
        return await asyncio.shield(task)

    async def _register_in_turn(self, spec: JobSpec, replace: bool) -> Registration:
        async with self._registering:
            return await self._register(spec, replace)

    async def _register(self, spec: JobSpec, replace: bool) -> Registration:
        existing = self.jobs.find(spec.job_id)
        if existing is not None and existing.spec == spec:
            existing.touch()
            return Registration(existing, True, [])
        differ = ([k for k, v in spec.to_dict().items() if existing.spec.to_dict()[k] != v]
                  if existing is not None else [])
        # (a job registered before its node list came may add it)
        other_world = [k for k in differ if k in WORLD_FIELDS and (k != "nodes" or existing.spec.nodes)]
        if other_world and existing is not None and existing.idle_s(time.time()) < RUNNING_WITHIN_S:
            raise SpecConflict(f"spec.job_id: job {spec.job_id!r} is running with another "
                               f"{' and '.join(other_world)} (world_size {existing.spec.world_size}, nodes "
                               f"{', '.join(existing.spec.nodes) or 'none'}); a second job cannot share its id")
        if differ and not replace:
            raise SpecConflict(f"spec.{differ[0]}: job {spec.job_id!r} is registered with a different "
                               f"{', '.join(differ)}; set replace to start it anew")
        job = Job(spec, self.create_policy(spec))
        self.jobs.check_room(spec.job_id)
        # Written (job row and state in one transaction) before it is held: a job
        # the store did not take is not registered, and the job it would replace
        # follows its path with its own estimate until then.
        try:
            await self.persister.save_registration(job)
        except Exception as exc:
            raise StoreUnavailable(f"store: the job could not be written ({exc}); register again") from None
        await self.network.add_job(job)
        net = self.network.bottleneck(job)
        if net is not None:
            job.observe_network(net)
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
        return Registration(job, False, differ)

    async def ingest(self, job: Job, reports: list[StepReport], network: tuple[float, float] | None) -> int:
        """One message's reports: to the network model as one observation per
        option, the network they ran on to the policy, then the reports (in
        slices, the loop serving others between them), then one decision. The
        network goes first: a job's first exploration is planned on the network
        its first report showed, not blind (blind, the decision churn bench's
        plan left Top-k out and two looks at it followed)."""
        epoch_before, received = job.last_epoch, time.time()
        reports = self.network.disturbed(job, reports, received)
        news = network if network is not None and network != job.reported_network else None
        if news is not None:
            job.reported_network = news
            job.dirty = True
        self.network.reported(job, reports, news)
        self.refresh_network(job)
        n = 0
        async for part in in_turns(len(reports)):
            n += job.ingest(reports[part], self._policy_error(job))
        if n:
            counter = self._report_counters.get(job.job_id)
            if counter is None:
                counter = self._report_counters[job.job_id] = self.metrics.reports.labels(job.job_id)
            counter.inc(n)
            self.metrics.observe_steps(job.job_id, reports)
            error = job.policy.model_error()
            if error is not None:
                self.metrics.model_error.labels(job.job_id).set(error)
        if job.closed:
            return n  # ended while its reports were ingested
        if job.redecide():
            self.decision_changed(job)
        if job.last_epoch > epoch_before and self.on_epoch is not None:
            self.on_epoch(job.last_epoch)
        return n

    async def end(self, job: Job, reason: str) -> None:
        """Take the job out of the agent (listing, probing, metrics) and write its end:
        `reason` is "ended" (its client said so) or "expired" (idle too long)."""
        self.jobs.remove(job.job_id)
        self.network.forget(job)
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

