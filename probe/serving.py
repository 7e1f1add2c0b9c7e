"""This node's iperf3 servers: one per address its peers reach it by, never the
wildcard, so that other nodes' agents can measure the path to this one.

Which addresses: those in the configured networks (`networks`, the agent's
`probe_serve_bind`) when any are configured, else the addresses the current
peers (the jobs' nodes) reach this host by (`probe.addresses.serving_addresses`).
With no peers and nothing configured nothing listens. `serve_for(peers)` starts
and stops servers to match; a server that cannot start is said once and the
others serve on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from flexcomm.probe.addresses import Network, addresses_within, serving_addresses
from flexcomm.probe.iperf import IperfError, IperfServer, ServerAuth

log = logging.getLogger("flexcomm.probe.serving")


def listen_address(address: str, port: int) -> str:
    """"10.0.0.1:5201", "[fd00::1]:5201"."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class ProbeServers:
    def __init__(self, port: int, *, networks: Sequence[Network] = (), auth: ServerAuth | None = None,
                 make_server: Callable[..., IperfServer] = IperfServer) -> None:
        self.port = port
        self.networks = tuple(networks)
        self.auth = auth
        self._make_server = make_server
        self._servers: dict[str, IperfServer] = {}
        self._failed: set[str] = set()

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses served now."""
        return tuple(self._servers)

    def listeners(self) -> list[str]:
        return [listen_address(a, self.port) for a in self._servers]

    def wanted(self, peers: Iterable[str]) -> list[str]:
        return addresses_within(self.networks) if self.networks else serving_addresses(peers)

    def serve_for(self, peers: Iterable[str]) -> tuple[str, ...]:
        """Serve exactly the addresses `peers` need (blocking: netlink, process starts)."""
        wanted = self.wanted(peers)
        before = self.addresses
        for address in [a for a in self._servers if a not in wanted]:
            self._servers.pop(address).stop()
        for address in wanted:
            if address not in self._servers:
                self._start(address)
        if self.addresses != before:
            log.info("iperf3 serving", extra={"fields": {"listening": self.listeners()}})
        return self.addresses

    def _start(self, address: str) -> None:
        server = self._make_server(self.port, bind=address, auth=self.auth)
        try:
            server.start()
        except IperfError as exc:  # IperfMissing included
            if address not in self._failed:
                self._failed.add(address)
                log.error("not serving iperf3; peers cannot measure this node there",
                          extra={"fields": {"address": address, "error": str(exc)}})
            return
        self._failed.discard(address)
        self._servers[address] = server

    def stop(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers.clear()
