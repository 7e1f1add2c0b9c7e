"""The agent's Prometheus metrics, in a registry of its own, served on /metrics.

Names follow Prometheus conventions: seconds and bits per second in the names,
_total for counters. Labels are bounded: jobs (max_jobs; an ended job's series
are removed), peers (their nodes), RPC methods and status codes. Every metric is
documented in docs/CONFIGURATION.md (a test checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from flexcomm.agent.config import split_host_port
from flexcomm.policy.types import StepReport

# RPC latency buckets from 25 us to 1 s: GetDecision should sit in the first few.
_LATENCY_BUCKETS = (2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.25, 1.0)


JOB_MEANS = {
    "step_seconds": "step time (compute + compression + sync)",
    "sync_seconds": "sync (collective) time",
    "compress_seconds": "compression time",
    "compute_seconds": "forward+backward time (the rest of the step)",
    "gain": "compression gain (1 for dense)",
}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rpcs = Counter("flexcomm_agent_rpcs_total", "RPCs answered, by method and status code",
                            ["method", "code"], registry=r)
        self.rpc_latency = Histogram("flexcomm_agent_rpc_latency_seconds", "Time to answer an RPC",
                                     ["method"], buckets=_LATENCY_BUCKETS, registry=r)
        self.decisions = Counter("flexcomm_agent_decisions_total", "Decision changes, by job",
                                 ["job", "collective"], registry=r)
        self.decision_cr = Gauge("flexcomm_agent_decision_cr", "Share of values the current decision sends "
                                 "(its Top-k CR; 1 for other families)", ["job"],
                                 registry=r)
        self.decision_version = Gauge("flexcomm_agent_decision_version", "Current decision version",
                                      ["job"], registry=r)
        self.model_error = Gauge("flexcomm_agent_model_error", "The cost model's current relative error, "
                                 "by job (policies with a model)", ["job"], registry=r)
        self.reports = Counter("flexcomm_agent_step_reports_total", "Step reports ingested", ["job"],
                               registry=r)
        self.jobs = Gauge("flexcomm_agent_jobs", "Running jobs", registry=r)
        self.jobs_ended = Counter("flexcomm_agent_jobs_ended_total", "Jobs ended, by reason "
                                  "(ended: the client said so; expired: idle past job_idle_expiry_s)",
                                  ["reason"], registry=r)
        job = ["job"]
        # Means over each batch of a job's reports, by what they are of.
        self.job_means = {name: Gauge(f"flexcomm_agent_job_{name}", f"Mean {what} over the job's latest "
                                      "batch of reports", job, registry=r) for name, what in JOB_MEANS.items()}
        self.job_cr = Gauge("flexcomm_agent_job_cr", "Share of values the job's latest report sent "
                            "(Top-k's CR; 1 for the other families)", job, registry=r)
        self.job_collective = Gauge("flexcomm_agent_job_collective", "1 for the compression and collective "
                                    "of the job's latest report", ["job", "compression", "collective"],
                                    registry=r)
        self._running: dict[str, tuple[str, str]] = {}
        self._decided: dict[str, set[str]] = {}
        self.peer_bandwidth = Gauge("flexcomm_agent_peer_bandwidth_bps", "Latest bandwidth to a peer",
                                    ["peer"], registry=r)
        self.peer_rtt = Gauge("flexcomm_agent_peer_rtt_seconds", "Latest median RTT to a peer",
                              ["peer"], registry=r)
        self.probe_failures = Counter("flexcomm_agent_probe_failures_total", "Failed probes",
                                      ["peer", "kind"], registry=r)
        self.store_errors = Counter("flexcomm_agent_store_errors_total", "Failed store writes",
                                    registry=r)
        self.policy_errors = Counter("flexcomm_agent_policy_errors_total",
                                     "Reports or observations a policy refused", ["job"], registry=r)

    def observe_steps(self, job_id: str, reports: Sequence[StepReport]) -> None:
        """A batch of a job's reports into its gauges (means; the last one's CR and collective)."""
        n = len(reports)
        if not n:
            return
        means = {"sync_seconds": sum(r.t_sync_s for r in reports) / n,
                 "compress_seconds": sum(r.t_comp_s for r in reports) / n,
                 "compute_seconds": sum(r.t_compute_s for r in reports) / n,
                 "gain": sum(r.gain for r in reports) / n}
        means["step_seconds"] = means["sync_seconds"] + means["compress_seconds"] + means["compute_seconds"]
        for name, value in means.items():
            self.job_means[name].labels(job_id).set(value)
        last = reports[-1]
        self.job_cr.labels(job_id).set(last.compression.cr)
        running, before = (last.compression.name, last.collective), self._running.get(job_id)
        if before != running:
            if before is not None:
                self.job_collective.remove(job_id, *before)
            self.job_collective.labels(job_id, *running).set(1)
            self._running[job_id] = running

    def forget_job(self, job_id: str) -> None:
        """Remove every series of an ended job."""
        for metric in (self.decision_cr, self.decision_version, self.model_error, self.reports,
                       self.policy_errors, self.job_cr, *self.job_means.values()):
            with contextlib.suppress(KeyError):  # never set for this job
                metric.remove(job_id)
        running = self._running.pop(job_id, None)
        if running is not None:
            self.job_collective.remove(job_id, *running)
        for collective in self._decided.pop(job_id, ()):
            self.decisions.remove(job_id, collective)

    def count_decision(self, job_id: str, collective: str) -> None:
        self.decisions.labels(job_id, collective).inc()
        self._decided.setdefault(job_id, set()).add(collective)

    def serve(self, listen: str) -> tuple[object, int]:
        """Start the /metrics HTTP server (a daemon thread); return it and its port."""
        host, port = split_host_port("metrics", listen)
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ValueError(f"metrics: cannot listen on {listen}: {exc.strerror or exc}") from None
        return server, server.server_port
