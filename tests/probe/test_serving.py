"""This node's iperf3 and look servers follow the peers' addresses, one real
`iperf3 -s` and one look server per address and never the wildcard; configured
networks take precedence."""

from __future__ import annotations

import socket

import pytest

from flexcomm.probe.addresses import parse_networks
from flexcomm.probe.iperf import listening
from flexcomm.probe.serving import ProbeServers, listen_address
from flexcomm.probe.train import TrainLookError, train_look
from support.agent_process import free_port


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP listener on `port` (/proc/net/tcp, IPv4)."""
    found = set()
    with open("/proc/net/tcp") as f:
        for row in (line.split() for line in list(f)[1:]):
            local, state = row[1], row[3]
            host, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(host)[::-1]))
    return found


def test_servers_follow_the_peers_and_stop(iperf3_binary) -> None:
    port, look_port = free_port(), free_port(socket.SOCK_DGRAM)
    servers = ProbeServers(port, look_port=look_port)
    try:
        assert servers.serve_for(()) == () and listening_addresses(port) == set()
        assert servers.serve_for(["127.0.0.1", "unresolvable.invalid"]) == ("127.0.0.1",)
        assert servers.listeners() == [f"127.0.0.1:{port}"]
        assert servers.look_listeners() == [f"127.0.0.1:{look_port}"]
        assert train_look("127.0.0.1", look_port, 64 << 10).ok
        pid = servers._servers["127.0.0.1"].pid
        assert listening(pid, port) and listening_addresses(port) == {"127.0.0.1"}
        servers.serve_for(["127.0.0.1"])  # unchanged: the same process serves on
        assert servers._servers["127.0.0.1"].pid == pid
        assert servers.serve_for([]) == () and listening_addresses(port) == set()
        assert servers.look_listeners() == []
        with pytest.raises(TrainLookError, match="nothing serves looks there"):
            train_look("127.0.0.1", look_port, 64 << 10)
    finally:
        servers.stop()


def test_configured_networks_are_served_without_peers(iperf3_binary) -> None:
    port = free_port()
    servers = ProbeServers(port, networks=parse_networks("probe_serve_bind", "127.0.0.0/8"))
    try:
        assert servers.serve_for(()) == ("127.0.0.1",)
        assert listening_addresses(port) == {"127.0.0.1"}
        assert "0.0.0.0" not in listening_addresses(port)
    finally:
        servers.stop()
    assert listening_addresses(port) == set()


def test_a_server_that_cannot_start_is_left_out(iperf3_binary, caplog) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        servers = ProbeServers(taken.getsockname()[1])
        try:
            assert servers.serve_for(["127.0.0.1"]) == ()
            assert "not serving iperf3" in caplog.text
        finally:
            servers.stop()


def test_listen_address_brackets_ipv6() -> None:
    assert listen_address("10.0.0.1", 5201) == "10.0.0.1:5201"
    assert listen_address("fd00::1", 5201) == "[fd00::1]:5201"
