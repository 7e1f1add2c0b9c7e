"""This host's addresses and the source address toward a peer, read through
netlink inside a real namespace pair (prefix "fcad", subnet 10.204.0.0/24)."""

from __future__ import annotations

import json
import sys

import pytest

from flexcomm.lab.netns import netns_pair
from flexcomm.probe.addresses import (
    addresses_within,
    host_of,
    is_local,
    local_addresses,
    parse_networks,
    serving_addresses,
)
from support.names import run_prefix

PROBE = (
    "import json\n"
    "from flexcomm.probe.addresses import local_addresses, source_address_toward, is_local, "
    "serving_addresses\n"
    "print(json.dumps({'local': sorted(local_addresses()), 'src': source_address_toward('10.204.0.2'),\n"
    "                  'none': source_address_toward('192.0.2.77'),\n"
    "                  'serve': serving_addresses(['10.204.0.1', '10.204.0.2', '192.0.2.77']),\n"
    "                  'self': is_local('10.204.0.1'), 'peer': is_local('10.204.0.2')}))\n"
)


@pytest.mark.privileged
def test_addresses_inside_a_namespace(privileged) -> None:
    with netns_pair(run_prefix("fcad"), "10.204.0.0/24") as (a, _b):
        proc = a.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout)
    assert "10.204.0.1" in seen["local"] and "127.0.0.1" in seen["local"]
    assert "10.204.0.2" not in seen["local"]
    assert seen["src"] == "10.204.0.1"
    assert seen["none"] is None  # the pair's namespace has no default route
    assert seen["self"] is True and seen["peer"] is False
    # This node's own entry and its peer's both say 10.204.0.1; the unroutable one nothing.
    assert seen["serve"] == ["10.204.0.1"]


def test_loopback_and_names() -> None:
    assert is_local("127.0.0.9") and is_local("::1") and is_local("0.0.0.0")
    assert not is_local("node-1.example")  # a name is not an address of ours
    assert not is_local("198.51.100.7", frozenset({"198.51.100.8"}))
    assert is_local("198.51.100.8", frozenset({"198.51.100.8"}))
    assert "127.0.0.1" in local_addresses()


def test_node_entries_networks_and_the_wildcard() -> None:
    assert [host_of(n) for n in ("10.0.0.2", "10.0.0.2:5201", "[fd00::2]:5201", "fd00::2", "node-3")] == [
        "10.0.0.2", "10.0.0.2", "fd00::2", "fd00::2", "node-3"]
    assert serving_addresses(["127.0.0.1", "localhost", "nowhere.invalid"]) == ["127.0.0.1"]
    nets = parse_networks("probe_serve_bind", "127.0.0.0/8, 198.51.100.7")
    assert addresses_within(nets, frozenset({"127.0.0.1", "198.51.100.7", "198.51.100.8"})) == [
        "127.0.0.1", "198.51.100.7"]
    for bad, words in (("0.0.0.0", "wildcard"), ("::", "wildcard"), ("eth0", "not an IP address")):
        with pytest.raises(ValueError, match=f"^probe_serve_bind: .*{words}"):
            parse_networks("probe_serve_bind", bad)
