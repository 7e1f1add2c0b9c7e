"""This node's iperf3 servers and look servers (probe/train.py): one of each per
address its peers reach it by, never the wildcard, so that other nodes' agents
can measure the path to this one (iperf3 on TCP `port`, looks on UDP `look_port`).

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
from flexcomm.probe.train import DEFAULT_LOOK_PORT, TrainServer

log = logging.getLogger("flexcomm.probe.serving")


def listen_address(address: str, port: int) -> str:
    """"10.0.0.1:5201", "[fd00::1]:5201"."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class ProbeServers:
    def __init__(self, port: int, *, look_port: int = DEFAULT_LOOK_PORT, networks: Sequence[Network] = (),
                 auth: ServerAuth | None = None, make_server: Callable[..., IperfServer] = IperfServer) -> None:
        self.port = port
        self.look_port = look_port
        self.networks = tuple(networks)
        self.auth = auth
        self._make_server = make_server
        self._servers: dict[str, IperfServer] = {}
        self._looks: dict[str, TrainServer] = {}
        self._failed: set[tuple[str, str]] = set()  # (what, address) said not to start

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses iperf3 serves now (look servers follow the same addresses)."""
        return tuple(self._servers)

    def listeners(self) -> list[str]:
        return [listen_address(a, self.port) for a in self._servers]

    def look_listeners(self) -> list[str]:
        return [listen_address(a, self.look_port) for a in self._looks]

    def wanted(self, peers: Iterable[str]) -> list[str]:
        return addresses_within(self.networks) if self.networks else serving_addresses(peers)

    def serve_for(self, peers: Iterable[str]) -> tuple[str, ...]:
        """Serve exactly the addresses `peers` need (blocking: netlink, process starts)."""
        wanted = self.wanted(peers)
        before = (self.addresses, tuple(self._looks))
        for servers in (self._servers, self._looks):
            for address in [a for a in servers if a not in wanted]:
                servers.pop(address).stop()
        for address in wanted:
            if address not in self._servers:
                self._start(address)
            if address not in self._looks:
                self._start_look(address)
        if (self.addresses, tuple(self._looks)) != before:
            log.info("iperf3 and looks serving", extra={"fields": {"listening": self.listeners(),
                                                                   "looks": self.look_listeners()}})
        return self.addresses

    def _start(self, address: str) -> None:
        server = self._make_server(self.port, bind=address, auth=self.auth)
        try:
            server.start()
        except IperfError as exc:  # IperfMissing included
            self._say_failed("iperf3", address, exc)
            return
        self._failed.discard(("iperf3", address))
        self._servers[address] = server

    def _start_look(self, address: str) -> None:
        try:
            self._looks[address] = TrainServer(self.look_port, bind=address).start()
        except OSError as exc:
            self._say_failed("looks", address, exc)
            return
        self._failed.discard(("looks", address))

    def _say_failed(self, what: str, address: str, exc: Exception) -> None:
        if (what, address) not in self._failed:
            self._failed.add((what, address))
            log.error(f"not serving {what}; peers cannot measure this node there",
                      extra={"fields": {"address": address, "error": str(exc)}})

    def stop(self) -> None:
        for servers in (self._servers, self._looks):
            for server in servers.values():
                server.stop()
            servers.clear()
