"""The agent's network model (flexcomm.probe.estimate.Estimator), fed and read on
the event loop: probe measurements and step reports go in; jobs whose bottleneck
may have moved are re-decided, probes are asked for when a job's own syncs say
its path moved, and GetNetwork's answer comes out.

A job's paths are those to its nodes but this host's own addresses (a path to
itself measures nothing).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flexcomm.agent.jobs import Job
from flexcomm.agent.metrics import Metrics
from flexcomm.policy.costmodel import ModelForms
from flexcomm.policy.types import GradientLayout, NetworkObservation, StepReport
from flexcomm.probe.addresses import is_local, local_addresses
from flexcomm.probe.estimate import Estimator, PeerPath
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Measurement

log = logging.getLogger("flexcomm.agent.network")
# Policy options that choose the cost model's formulas (MooConfig's names).
FORM_OPTIONS = {"ag_form": "ag", "tree_form": "tree", "index_bytes": "index_bytes"}

# (peers, expected_bps) -> seconds until the duty budget has room for the first
RequestProbes = Callable[[Sequence[str], "float | None"], float]


def model_forms(options: dict[str, Any], layout: GradientLayout) -> ModelForms:
    """The formulas a job's policy predicts with, so its syncs are read alike."""
    chosen = {name: options[key] for key, name in FORM_OPTIONS.items() if key in options}
    return ModelForms(value_bytes=layout.value_bytes, **chosen)


def job_layout(job: Job) -> GradientLayout:
    """The job's gradient as it described it, else one vector of its bytes."""
    return job.spec.layout or GradientLayout.flat(job.spec.grad_bytes)


def job_peers(nodes: Iterable[str], own: frozenset[str]) -> list[str]:
    """The nodes a job's syncs reach from here: all but this host's `own` addresses."""
    return [n for n in dict.fromkeys(nodes) if not is_local(n, own)]


class NetworkFeed:
    """`redecide(job_id)` gives a job's policy its current bottleneck;
    `request_probes(peers, expected_bps)`, when probing runs, asks for bandwidth
    tests now and says how soon the duty budget allows them."""

    def __init__(self, estimator: Estimator, metrics: Metrics, redecide: Callable[[str], None],
                 request_probes: RequestProbes | None = None) -> None:
        self.estimator = estimator
        self.metrics = metrics
        self.redecide = redecide
        self.request_probes = request_probes
        self._reading: dict[str, tuple[GradientLayout, ModelForms]] = {}  # how each job's syncs are read

    async def add_job(self, job: Job) -> None:
        """Follow a registered job's paths from now on; a resumed job starts from
        the network its policy last saw."""
        own = await asyncio.to_thread(local_addresses)  # netlink: off the event loop
        now = time.time()
        estimate = self.estimator.add_job(job.job_id, job_peers(job.spec.nodes, own), now)
        layout = job_layout(job)
        self._reading[job.job_id] = (layout, model_forms(job.spec.options, layout))
        if job.reported_network is not None:
            self.estimator.observe_reported_network(job.job_id, *job.reported_network, now)
        elif job.network is not None:
            estimate.observe_active(job.network.beta_s_per_byte, now, job.network.evidence or "probe")
        estimate.wants_probe = True  # the paths as they are now, before the job loads them
        self._ask_probes(job.job_id)

    async def forget(self, job: Job, existing: Job | None = None) -> None:
        """Stop following a job (it ended), or, after a registration the store
        refused, go back to the job held before (`existing`)."""
        self.estimator.remove_job(job.job_id)
        self._reading.pop(job.job_id, None)
        if existing is not None:
            await self.add_job(existing)

    def measured(self, m: Measurement) -> None:
        """One probe's measurement: into the model and the metrics; the jobs it
        concerns are re-decided."""
        if not m.ok:
            failures = self.estimator.peer(m.peer).failures + 1
            self.metrics.probe_failures.labels(m.peer, m.kind).inc()
            if failures == 1:
                log.warning("probe failed", extra={"fields": {"peer": m.peer, "kind": m.kind,
                                                              "error": m.error}})
        before = self._moves(self.estimator.jobs)
        affected = self.estimator.observe(m, m.ts or time.time())
        self._log_moves(before)
        peer = self.estimator.peer(m.peer)
        if peer.bandwidth_bps:
            self.metrics.peer_bandwidth.labels(m.peer).set(peer.bandwidth_bps)
        if peer.rtt_s:
            self.metrics.peer_rtt.labels(m.peer).set(peer.rtt_s)
        for job_id in affected:
            self.redecide(job_id)
            self._ask_probes(job_id)

    def restore(self, measurements: Iterable[Measurement]) -> None:
        """What the probes knew before a restart, as of when they measured it."""
        for m in measurements:
            if m.ok:
                self.estimator.observe(m, m.ts or 0.0)

    def reported(self, job: Job, reports: Sequence[StepReport],
                 network: tuple[float, float] | None) -> None:
        """A job's step reports (each sync time a passive observation) and, when it
        sent one, its own estimate of its network."""
        now, before = time.time(), self._moves([job.job_id])
        layout, forms = self._reading[job.job_id]
        for r in reports:
            self.estimator.observe_report(job.job_id, r, layout, job.spec.world_size, now, forms)
        if network is not None:
            self.estimator.observe_reported_network(job.job_id, network[0], network[1], now)
        self._log_moves(before)
        self._ask_probes(job.job_id)

    def _moves(self, job_ids: Iterable[str]) -> dict[str, float | None]:
        return {job_id: self.estimator.jobs[job_id].moved_at for job_id in job_ids}

    def _log_moves(self, before: dict[str, float | None]) -> None:
        for job_id, moved_at in before.items():
            e = self.estimator.jobs[job_id]
            if e.moved_at != moved_at and e.bandwidth_bps:
                log.info("network estimate moved", extra={"fields": {
                    "job": job_id, "bandwidth_bps": round(e.bandwidth_bps), "evidence": e.evidence}})

    def _ask_probes(self, job_id: str) -> None:
        """One bandwidth test when the job's estimate wants one: of the peer tested
        longest ago (one reading confirms or refutes a move; the duty budget has
        room for a few a minute, not a round of every peer at each move)."""
        estimate = self.estimator.jobs[job_id]
        if not estimate.wants_probe:
            return
        estimate.wants_probe = False
        peers = self.estimator.job_peers[job_id]
        if self.request_probes is None or not peers:
            estimate.probe_wait_s = math.inf  # no probe will come: the syncs stand alone
            return
        peer = min(peers, key=lambda a: self.estimator.peer(a).measured or 0.0)
        expected = estimate.pending_bandwidth_bps or estimate.bandwidth_bps
        estimate.probe_wait_s = self.request_probes([peer], expected)
        log.info("probe asked for", extra={"fields": {"job": job_id, "peer": peer, "expected_bps": expected,
                                                      "budget_wait_s": round(estimate.probe_wait_s, 1)}})

    def bottleneck(self, job: Job) -> NetworkObservation | None:
        return self.estimator.bottleneck(job.job_id, job.spec.world_size)

    def state(self, job: Job | None) -> pb.NetworkState:
        """Per-peer figures (the job's nodes, or every peer) and the job's bottleneck."""
        if job is None:
            return pb.NetworkState(peers=[peer_state(p) for p in self.estimator.peers.values()])
        peers = [peer_state(self.estimator.peers.get(n) or PeerPath(n), "probe" if n in
                            self.estimator.job_peers[job.job_id] else "self") for n in job.spec.nodes]
        estimate = self.estimator.jobs[job.job_id]
        if estimate.beta_s_per_byte:
            peers.append(pb.PeerState(
                address=f"job:{job.job_id}", bandwidth_bps=estimate.bandwidth_bps,
                beta_s_per_byte=estimate.beta_s_per_byte, alpha_s=estimate.alpha_fit or 0.0,
                source=estimate.evidence, updated_unix=estimate.moved_at or 0.0))
        net = self.bottleneck(job)
        if net is None:
            return pb.NetworkState(peers=peers, bottleneck=pb.Bottleneck(nodes=job.spec.world_size))
        return pb.NetworkState(peers=peers, bottleneck=pb.Bottleneck(
            alpha_s=net.alpha_s, beta_s_per_byte=net.beta_s_per_byte, bandwidth_bps=net.bandwidth_bps,
            nodes=net.nodes, known=True, peak_over_rate=net.bucket.peak_over_rate, burst_s=net.bucket.burst_s,
            evidence=net.evidence))


def peer_state(p: PeerPath, source: str = "probe") -> pb.PeerState:
    """A peer's figures as GetNetwork shows them; `source` "self" for this host's
    own address (never probed)."""
    measured = p.beta_s_per_byte is not None or p.alpha_s is not None
    return pb.PeerState(address=p.address, bandwidth_bps=p.bandwidth_bps or 0.0, rtt_s=p.rtt_s or 0.0,
                        rtt_p99_s=p.rtt_p99_s or 0.0, loss=p.loss or 0.0, alpha_s=p.alpha_s or 0.0,
                        beta_s_per_byte=p.beta_s_per_byte or 0.0,
                        source=source if measured or source == "self" else "none",
                        updated_unix=p.updated or 0.0, probe_failures=p.failures)
