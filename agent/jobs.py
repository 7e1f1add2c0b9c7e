"""Per-job state: the job's policy, its current decision, its statistics, and
what has not been written to the store yet.

Everything here runs on the server's event loop (no locks). A decision gets a
new version only when what the ranks would run changes (compression, collective,
root) or whether they run it only to measure it (`exploring`); a new reason
alone is no new version. Watchers wait on an asyncio.Event that is replaced at
each change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.linkestimate import LinkEstimate, network_news
from flexcomm.policy.types import Decision, NetworkObservation, Policy, StepReport
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto.convert import decision_to_proto, spec_to_proto

log = logging.getLogger("flexcomm.agent.jobs")
STATE_FORMAT = 1


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job_id: no job {job_id!r} is registered")


class Job:
    """One registered job. `on_change(job)` is called after each decision change."""

    def __init__(self, spec: JobSpec, policy: Policy, *, registered_unix: float | None = None) -> None:
        self.spec = spec
        self.policy = policy
        self.registered_unix = time.time() if registered_unix is None else registered_unix
        self.last_step = 0
        self.last_epoch = 0
        self.reports = 0
        self.last_report_unix = 0.0
        self.policy_errors = 0
        # When the job's client was last heard from, and its open WatchDecisions
        # streams: what the idle expiry judges.
        self.last_seen_unix = self.registered_unix
        self.watchers = 0
        # The job's own estimate of its network: (alpha_s, bandwidth_bps).
        self.reported_network: tuple[float, float] | None = None
        self.network: NetworkObservation | None = None
        # The network model's estimate of the job's path (held by the network feed),
        # and, for a resumed job, the state it continues from.
        self.estimate: LinkEstimate | None = None
        self.estimate_state: dict[str, Any] | None = None
        self.pending_reports: list[StepReport] = []
        self.pending_decisions: list[tuple[Decision, float]] = []
        self.dirty = True
        self.closed = False
        self._changed = asyncio.Event()
        self.version = 0
        self.decision: Decision
        self.decided_unix = 0.0
        self.decision_pb: pb.Decision
        self._adopt(policy.decide())

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    # -- decisions ------------------------------------------------------------
    def _adopt(self, decision: Decision, now: float | None = None) -> None:
        self.version += 1
        self.decision = dataclasses.replace(decision, version=self.version)
        self.decided_unix = time.time() if now is None else now
        self.decision_pb = decision_to_proto(self.decision, self.job_id, self.decided_unix)
        self.pending_decisions.append((self.decision, self.decided_unix))
        self.dirty = True
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def redecide(self) -> bool:
        """Have the policy choose on what it observed since; True when the decision changed."""
        decision = self.policy.choose()
        if decision.same_choice(self.decision) and decision.exploring == self.decision.exploring:
            return False
        self._adopt(decision)
        log.info("decision changed", extra={"fields": {
            "job": self.job_id, "version": self.version, "compression": decision.compression.name,
            "collective": decision.collective, "root": decision.root, "reason": decision.reason}})
        return True

    async def wait_change(self, after_version: int) -> None:
        """Return once the decision version exceeds `after_version` or the job closes."""
        while self.version <= after_version and not self.closed:
            await self._changed.wait()

    def close(self) -> None:
        self.closed = True
        self._changed.set()

    # -- liveness ---------------------------------------------------------------
    def touch(self, now: float | None = None) -> None:
        """The job's client was heard from."""
        self.last_seen_unix = time.time() if now is None else now

    def idle_s(self, now: float) -> float:
        """Seconds since the client was last heard from (0 while a watcher is open)."""
        return 0.0 if self.watchers else max(0.0, now - self.last_seen_unix)

    # -- observations ---------------------------------------------------------
    def observe_network(self, net: NetworkObservation) -> bool:
        """Feed the bottleneck to the policy if it is news (`network_news`); True if
        the decision changed."""
        if not network_news(self.network, net):
            return False
        self.network = net
        self.policy.observe_network(net)
        self.dirty = True
        return self.redecide()

    def ingest(self, reports: Sequence[StepReport], on_policy_error: Callable[[str], None]) -> int:
        """Feed step reports to the policy (`redecide` has it choose on them) and
        keep them for the store; return the count."""
        if not reports:
            return 0
        try:
            self.policy.observe_steps(reports)
        except ValueError as exc:
            # A report this policy cannot take: the rest of the slice goes unobserved
            # (counted once); the store keeps every report still.
            self.policy_errors += 1
            on_policy_error(str(exc))
        for r in reports:
            self.last_step = max(self.last_step, r.step)
            self.last_epoch = max(self.last_epoch, r.epoch)
        self.pending_reports.extend(reports)
        self.reports += len(reports)
        self.last_report_unix = time.time()
        self.dirty = True
        return len(reports)

    # -- persistence ----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What the store keeps to resume this job after a restart."""
        return {
            "format": STATE_FORMAT,
            "policy": self.policy.state_dict(),
            "decision": self.decision.to_dict(),
            "decided_unix": self.decided_unix,
            "registered_unix": self.registered_unix,
            "last_step": self.last_step,
            "last_epoch": self.last_epoch,
            "reports": self.reports,
            "last_report_unix": self.last_report_unix,
            "last_seen_unix": self.last_seen_unix,
            "reported_network": list(self.reported_network) if self.reported_network else None,
            "network": self.network.to_dict() if self.network else None,
            "estimate": self.estimate.state_dict() if self.estimate is not None else self.estimate_state,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from `state()` as stored; the policy continues where it was."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"state.format: expected {STATE_FORMAT}, got {state.get('format')!r}")
        self.policy.load_state_dict(state["policy"])
        self.registered_unix = float(state["registered_unix"])
        self.last_step = int(state["last_step"])
        self.last_epoch = int(state["last_epoch"])
        self.reports = int(state["reports"])
        self.last_report_unix = float(state["last_report_unix"])
        self.last_seen_unix = max(float(state.get("last_seen_unix", 0.0)), self.last_report_unix,
                                  self.registered_unix)
        rn = state.get("reported_network")
        self.reported_network = (float(rn[0]), float(rn[1])) if rn else None
        net = state.get("network")
        self.network = NetworkObservation(**net) if net else None
        self.estimate_state = state.get("estimate")
        decision = Decision.from_dict(state["decision"])
        self.version = decision.version - 1
        self._adopt(decision, now=float(state["decided_unix"]))
        self.pending_decisions.clear()  # already in the store
        self.dirty = False

    def take_pending(self) -> tuple[list[StepReport], list[tuple[Decision, float]], dict | None]:
        """Hand over what the store has not seen: reports, decisions, state if changed."""
        reports, self.pending_reports = self.pending_reports, []
        decisions, self.pending_decisions = self.pending_decisions, []
        state = self.state() if self.dirty else None
        self.dirty = False
        return reports, decisions, state

    def put_back(self, reports: list[StepReport], decisions: list[tuple[Decision, float]]) -> None:
        """Return what a failed store write did not take, ahead of anything newer."""
        self.pending_reports[:0] = reports
        self.pending_decisions[:0] = decisions

    def info(self) -> pb.JobInfo:
        return pb.JobInfo(spec=spec_to_proto(self.spec), decision=self.decision_pb, last_step=self.last_step,
                          last_epoch=self.last_epoch, reports=self.reports,
                          registered_unix=self.registered_unix, last_report_unix=self.last_report_unix)


class Jobs:
    """The registered jobs, by id."""

    def __init__(self, max_jobs: int) -> None:
        self.max_jobs = max_jobs
        self._jobs: dict[str, Job] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self):
        return iter(list(self._jobs.values()))

    def get(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def find(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def check_room(self, job_id: str) -> None:
        """OverflowError when `job_id` is new and the agent is full."""
        if job_id not in self._jobs and len(self._jobs) >= self.max_jobs:
            raise OverflowError(f"job_id: the agent already runs max_jobs={self.max_jobs} jobs; "
                                f"{job_id!r} gets no decisions until one ends (or raise max_jobs)")

    def add(self, job: Job) -> None:
        self.check_room(job.job_id)
        old = self._jobs.get(job.job_id)
        if old is not None:
            old.close()
        self._jobs[job.job_id] = job

    def remove(self, job_id: str) -> Job:
        """Take the job out (its watchers end); JobNotFound if it is not here."""
        job = self.get(job_id)
        del self._jobs[job_id]
        job.close()
        return job
