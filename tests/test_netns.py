"""The emulated hosts: real namespaces, real veth, real traffic between them."""

from __future__ import annotations

import socket

import pytest

from flexcomm.lab import netns

pytestmark = pytest.mark.privileged


def _tcp_echo_works(server: netns.Node, client: netns.Node) -> bool:
    srv = server.popen(["python3", "-c", (
        "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
        f"s.bind(('{server.address}',47001));s.listen();c,_=s.accept();c.sendall(c.recv(5))"
    )])
    try:
        out = client.run(["python3", "-c", (
            "import socket,time\n"
            "for _ in range(50):\n"
            "    try:\n"
            f"        s=socket.create_connection(('{server.address}',47001),timeout=1);break\n"
            "    except OSError: time.sleep(0.1)\n"
            "s.sendall(b'hello');print(s.recv(5).decode())"
        )], capture_output=True, text=True, timeout=20)
        return out.stdout.strip() == "hello"
    finally:
        srv.kill()
        srv.wait()


def test_pair_carries_traffic_and_is_removed(privileged: None) -> None:
    with netns.netns_pair("fctnp", "10.209.0.0/24") as (a, b):
        assert {a.ns, b.ns} <= set(netns.list_namespaces())
        assert (a.address, b.address) == ("10.209.0.1", "10.209.0.2")
        assert _tcp_echo_works(a, b)
    assert not [n for n in netns.list_namespaces() if n.startswith("fctnp")]


def test_cluster_nodes_reach_each_other_through_the_bridge(privileged: None) -> None:
    with netns.cluster("fctnc", 3, "10.209.1.0/24") as nodes:
        assert [n.address for n in nodes] == ["10.209.1.1", "10.209.1.2", "10.209.1.3"]
        assert _tcp_echo_works(nodes[2], nodes[0])
    assert not [n for n in netns.list_namespaces() if n.startswith("fctnc")]


def test_stale_namespaces_from_a_crash_are_replaced(privileged: None) -> None:
    netns.ip("netns", "add", "fctnsa")
    try:
        with netns.netns_pair("fctns", "10.209.2.0/24") as (a, _b):
            assert a.ns == "fctnsa"
    finally:
        netns.destroy_prefix("fctns")
    assert "fctnsa" not in netns.list_namespaces()


def test_bad_subnet_and_empty_prefix_are_refused() -> None:
    with pytest.raises(ValueError, match="subnet"):
        netns._hosts("10.0.0.0/31", 3)
    with pytest.raises(ValueError, match="subnet"):
        netns._hosts("not-a-net", 2)
    with pytest.raises(ValueError, match="prefix"):
        netns.destroy_prefix("")


def test_host_namespace_is_untouched(privileged: None) -> None:
    before = set(socket.if_nameindex())
    with netns.cluster("fctnh", 2, "10.209.3.0/24"):
        assert set(socket.if_nameindex()) == before
