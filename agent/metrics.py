"""The agent's Prometheus metrics, in a registry of its own, served on /metrics.

Names follow Prometheus conventions: seconds and bits per second in the names,
_total for counters. Labels are bounded: jobs (max_jobs), peers (their nodes),
RPC methods and status codes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from flexcomm.agent.config import split_host_port

# RPC latency buckets from 25 us to 1 s: GetDecision should sit in the first few.
_LATENCY_BUCKETS = (2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.25, 1.0)


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
        self.jobs = Gauge("flexcomm_agent_jobs", "Registered jobs", registry=r)
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

    def serve(self, listen: str) -> tuple[object, int]:
        """Start the /metrics HTTP server (a daemon thread); return it and its port."""
        host, port = split_host_port("metrics", listen)
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ValueError(f"metrics: cannot listen on {listen}: {exc.strerror or exc}") from None
        return server, server.server_port
