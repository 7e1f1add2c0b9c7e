"""What the agent knows of the network: the latest estimate per peer (from the
probe scheduler) and each job's own estimate, and a job's bottleneck.

The bottleneck of a job is the worst of what is known about its paths: the
lowest bandwidth and the highest per-message latency among its nodes' probe
estimates and the job's own report (DESIGN.md section 7: active probes and
passive figures are combined). With nothing known it is None, and the policy
keeps deciding on what it saw last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from flexcomm.agent.jobs import Job
from flexcomm.policy.types import PLAIN_LINK, LinkBucket, NetworkObservation
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Measurement


@dataclass
class PeerEstimate:
    address: str
    bandwidth_bps: float = 0.0
    rtt_s: float = 0.0
    rtt_p99_s: float = 0.0
    loss: float = 0.0
    alpha_s: float = 0.0
    source: str = "probe"
    updated_unix: float = 0.0
    probe_failures: int = 0

    @property
    def known(self) -> bool:
        return self.bandwidth_bps > 0

    def to_proto(self) -> pb.PeerState:
        beta = 8.0 / self.bandwidth_bps if self.bandwidth_bps > 0 else 0.0
        return pb.PeerState(address=self.address, bandwidth_bps=self.bandwidth_bps, rtt_s=self.rtt_s,
                            rtt_p99_s=self.rtt_p99_s, loss=self.loss, alpha_s=self.alpha_s,
                            beta_s_per_byte=beta, source=self.source, updated_unix=self.updated_unix,
                            probe_failures=self.probe_failures)


class NetworkView:
    """`bucket`: the token bucket every path is taken to have (configured, not probed)."""

    def __init__(self, bucket: LinkBucket = PLAIN_LINK) -> None:
        self.peers: dict[str, PeerEstimate] = {}
        self.bucket = bucket

    def peer(self, address: str) -> PeerEstimate:
        return self.peers.setdefault(address, PeerEstimate(address))

    def update_peer(self, address: str, *, bandwidth_bps: float | None = None,
                    alpha_s: float | None = None, rtt_s: float | None = None,
                    rtt_p99_s: float | None = None, loss: float | None = None) -> PeerEstimate:
        p = self.peer(address)
        for name, value in (("bandwidth_bps", bandwidth_bps), ("alpha_s", alpha_s), ("rtt_s", rtt_s),
                            ("rtt_p99_s", rtt_p99_s), ("loss", loss)):
            if value is not None:
                setattr(p, name, float(value))
        p.updated_unix = time.time()
        return p

    def restore(self, m: Measurement) -> None:
        """Take a stored (successful) measurement as the peer's figures, as of its time."""
        p = self.update_peer(m.peer, bandwidth_bps=m.bandwidth_bps, alpha_s=m.alpha_s,
                             rtt_s=m.rtt_p50_s, rtt_p99_s=m.rtt_p99_s, loss=m.loss)
        p.updated_unix = m.ts or 0.0

    def record_failure(self, address: str) -> PeerEstimate:
        p = self.peer(address)
        p.probe_failures += 1
        return p

    def bottleneck(self, job: Job) -> NetworkObservation | None:
        bandwidths, alphas = [], []
        for node in job.spec.nodes:
            p = self.peers.get(node)
            if p is not None and p.known:
                bandwidths.append(p.bandwidth_bps)
                alphas.append(p.alpha_s)
        if job.reported_network is not None:
            alphas.append(job.reported_network[0])
            bandwidths.append(job.reported_network[1])
        if not bandwidths:
            return None
        return NetworkObservation.from_link(max(alphas), min(bandwidths), job.spec.world_size, self.bucket)

    def state(self, job: Job | None) -> pb.NetworkState:
        """Per-peer figures (the job's nodes, or every peer) and the job's bottleneck."""
        if job is None:
            peers = [p.to_proto() for p in self.peers.values()]
            return pb.NetworkState(peers=peers)
        peers = [self.peer_or_empty(n).to_proto() for n in job.spec.nodes]
        if job.reported_network is not None:
            alpha, bw = job.reported_network
            peers.append(PeerEstimate(f"job:{job.job_id}", bandwidth_bps=bw, alpha_s=alpha, source="report",
                                      updated_unix=job.last_report_unix).to_proto())
        net = self.bottleneck(job)
        if net is None:
            return pb.NetworkState(peers=peers, bottleneck=pb.Bottleneck(nodes=job.spec.world_size))
        return pb.NetworkState(peers=peers, bottleneck=pb.Bottleneck(
            alpha_s=net.alpha_s, beta_s_per_byte=net.beta_s_per_byte, bandwidth_bps=net.bandwidth_bps,
            nodes=net.nodes, known=True, peak_over_rate=net.bucket.peak_over_rate, burst_s=net.bucket.burst_s))

    def peer_or_empty(self, address: str) -> PeerEstimate:
        return self.peers.get(address) or PeerEstimate(address, source="none")
