"""Probing the nodes of the registered jobs, and serving this node's iperf3.

One probe scheduler (flexcomm.probe.scheduler) runs in its own thread for the
agent's lifetime over the union of every job's nodes; when that set changes it
is told so (`set_peers`), never replaced, so its duty-cycle budget keeps
counting the tests it already ran. Measurements are stored by the scheduler, smoothed by one
Estimator, and handed to the event loop, where the
network view, the metrics and the affected jobs' policies are updated.

The agent also keeps iperf3 servers on `probe_port` so that the agents of
other nodes can measure the path to this one, bound only to the addresses the
jobs' nodes reach this node by, or to `probe_serve_bind` (flexcomm.probe.serving).
Without the iperf3 binary that is said once and the agent serves on (latency
probes need no iperf3).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from flexcomm.agent.config import AgentConfig
from flexcomm.probe.addresses import parse_networks
from flexcomm.probe.estimate import Estimator
from flexcomm.probe.scheduler import ProbeConfig, ProbeScheduler
from flexcomm.probe.serving import ProbeServers
from flexcomm.store import Measurement

if TYPE_CHECKING:
    from flexcomm.agent.server import Agent

log = logging.getLogger("flexcomm.agent.probing")


class Probing:
    def __init__(self, config: AgentConfig) -> None:
        self.probe_config = ProbeConfig(
            iperf_port=config.probe_port, latency_port=config.probe_port,
            latency_interval_s=config.probe_interval_s,
            bandwidth_interval_s=config.probe_bandwidth_interval_s,
            test_duration_s=config.probe_test_duration_s, auth=config.client_auth())
        self.estimator = Estimator()
        self.servers = (ProbeServers(config.probe_port, auth=config.server_auth(),
                                     networks=parse_networks("probe_serve_bind", config.probe_serve_bind))
                        if config.probe_serve else None)
        self.scheduler: ProbeScheduler | None = None
        self.peers: tuple[str, ...] = ()
        self._agent: Agent | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, agent: Agent) -> None:
        self._agent = agent
        self._loop = asyncio.get_running_loop()
        if self.servers is not None:
            await asyncio.to_thread(self.servers.serve_for, ())
        await self.update_peers()

    async def update_peers(self) -> None:
        """Probe exactly the nodes of the registered jobs."""
        assert self._agent is not None
        peers = tuple(sorted({n for job in self._agent.jobs for n in job.spec.nodes}))
        if peers == self.peers:
            return
        self.peers = peers
        if self.servers is not None:
            await asyncio.to_thread(self.servers.serve_for, peers)
        if self.scheduler is None:
            self.scheduler = ProbeScheduler(peers, self.probe_config, store=self._agent.persister.store,
                                            estimator=self.estimator,
                                            on_measurement=self._from_probe_thread).start()
        else:
            self.scheduler.set_peers(peers)
        log.info("probing", extra={"fields": {"peers": list(peers)}})

    def _from_probe_thread(self, m: Measurement) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.apply, m)

    def apply(self, m: Measurement) -> None:
        """On the event loop: one measurement into the network view, metrics, jobs."""
        agent = self._agent
        assert agent is not None
        if not m.ok:
            peer = agent.network.record_failure(m.peer)
            agent.metrics.probe_failures.labels(m.peer, m.kind).inc()
            if peer.probe_failures == 1:
                log.warning("probe failed", extra={"fields": {"peer": m.peer, "kind": m.kind,
                                                              "error": m.error}})
            return
        est = self.estimator.peer(m.peer)
        peer = agent.network.update_peer(m.peer, bandwidth_bps=est.bandwidth_bps, alpha_s=est.alpha_s,
                                         rtt_s=m.rtt_p50_s, rtt_p99_s=m.rtt_p99_s, loss=m.loss)
        if peer.bandwidth_bps:
            agent.metrics.peer_bandwidth.labels(m.peer).set(peer.bandwidth_bps)
        if peer.rtt_s:
            agent.metrics.peer_rtt.labels(m.peer).set(peer.rtt_s)
        for job in agent.jobs:
            if m.peer in job.spec.nodes:
                agent.service.refresh_network(job)

    async def stop(self) -> None:
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)
        if self.servers is not None:
            await asyncio.to_thread(self.servers.stop)
