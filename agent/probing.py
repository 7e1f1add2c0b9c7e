"""Probing the nodes of the registered jobs, and serving this node's iperf3 and looks.

One probe scheduler (flexcomm.probe.scheduler) runs in its own thread for the
agent's lifetime over the union of every job's nodes (this host's own addresses
left out); when that set changes it is told so (`update_peers`), never
replaced, so its duty-cycle budget keeps counting the tests it already ran.
Measurements are stored by the scheduler and handed to the event loop
(`on_measurement`), as is the start of each bandwidth test (`on_bandwidth_start`);
`request_bandwidth` asks for tests now, `request_looks` for looks.

The agent also keeps iperf3 servers on `probe_port` (and look servers on UDP
`probe_look_port`) so that the agents of other nodes can measure the path to
this one, bound only to the addresses the jobs' nodes reach this node by, or to
`probe_serve_bind` (flexcomm.probe.serving).
Without the iperf3 binary that is said once and the agent serves on (latency
probes need no iperf3).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Sequence

from flexcomm.agent.config import AgentConfig
from flexcomm.probe.addresses import parse_networks
from flexcomm.probe.scheduler import ProbeConfig, ProbeScheduler
from flexcomm.probe.serving import ProbeServers
from flexcomm.store import Measurement, Store

log = logging.getLogger("flexcomm.agent.probing")


class Probing:
    """`on_measurement(m)` is called on the event loop with every measurement, and
    `on_bandwidth_start(peer, unix_time)` as each bandwidth test starts (None:
    the peer's server turned it away)."""

    def __init__(self, config: AgentConfig, on_measurement: Callable[[Measurement], None],
                 on_bandwidth_start: Callable[[str, float | None], None]) -> None:
        self.probe_config = ProbeConfig(
            iperf_port=config.probe_port, latency_port=config.probe_port, look_port=config.probe_look_port,
            latency_interval_s=config.probe_interval_s,
            bandwidth_interval_s=config.probe_bandwidth_interval_s,
            test_duration_s=config.probe_test_duration_s, sized_test_s=config.probe_sized_test_s,
            look_duty_cycle=config.probe_look_duty_cycle,
            auth=config.client_auth())
        self.on_measurement = on_measurement
        self.on_bandwidth_start = on_bandwidth_start
        self.servers = (ProbeServers(config.probe_port, look_port=config.probe_look_port, auth=config.server_auth(),
                                     networks=parse_networks("probe_serve_bind", config.probe_serve_bind))
                        if config.probe_serve else None)
        self.scheduler: ProbeScheduler | None = None
        self.peers: tuple[str, ...] = ()
        self._store: Store | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, store: Store | None, peers: Iterable[str]) -> None:
        """Serve iperf3 and probe `peers`; measurements are written to `store`."""
        self._store = store
        self._loop = asyncio.get_running_loop()
        if self.servers is not None:
            await asyncio.to_thread(self.servers.serve_for, ())
        await self.update_peers(peers)

    async def update_peers(self, peers: Iterable[str]) -> None:
        """Probe exactly these nodes (the registered jobs'), but this host's own
        (the scheduler reads them through netlink, so off the event loop)."""
        peers = tuple(sorted(set(peers)))
        if peers == self.peers or self._loop is None:
            return
        self.peers = peers
        if self.servers is not None:
            await asyncio.to_thread(self.servers.serve_for, peers)
        if self.scheduler is None:
            self.scheduler = await asyncio.to_thread(
                ProbeScheduler, peers, self.probe_config, store=self._store,
                on_measurement=self._from_probe_thread(self.on_measurement),
                on_bandwidth_start=self._from_probe_thread(self.on_bandwidth_start))
            self.scheduler.start()
        else:
            await asyncio.to_thread(self.scheduler.set_peers, peers)
        log.info("probing", extra={"fields": {"peers": sorted(self.scheduler.schedule),
                                              "own_addresses_skipped": list(self.scheduler.skipped)}})

    def request_bandwidth(self, peers: Sequence[str]) -> float:
        """Bandwidth tests of `peers` as soon as the duty budget allows; the
        seconds until it does (inf before probing starts)."""
        if self.scheduler is None:
            return math.inf
        return self.scheduler.request_bandwidth(peers)

    def request_looks(self, peers: Sequence[str], follow_up: bool = False) -> None:
        """Looks at `peers` when their share of the time allows, or for a
        `follow_up` on the follow-ups' own share (none before probing starts)."""
        if self.scheduler is not None:
            self.scheduler.request_look(peers, follow_up)

    def _from_probe_thread(self, callback: Callable[..., None]) -> Callable[..., None]:
        """`callback`, called from the probe thread, run on the event loop (in order)."""
        def call(*args: object) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(callback, *args)
        return call

    async def stop(self) -> None:
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)
        if self.servers is not None:
            await asyncio.to_thread(self.servers.stop)
