"""Helpers shared by the emulation tests (test_shaping, test_emulate).

Namespaces are named "fce<pid><tag>" so that two runs of the suite at once never
share one; the subnet is this part's own, 10.202.0.0/24.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flexcomm.lab.netns import Node, cluster, netns_pair
from support.cli import flexcomm
from support.waiting import scaled

SUBNET = "10.202.0.0/24"


@contextmanager
def pair(tag: str) -> Iterator[tuple[Node, Node]]:
    with netns_pair(f"fce{os.getpid()}{tag}", SUBNET) as nodes:
        yield nodes


def show_json(node: Node, env: dict[str, str]) -> dict[str, Any]:
    done = flexcomm(["emulate", "show", "--dev", node.ifname, "--netns", node.ns, "--json"], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def iperf3_goodput_bps(iperf3: str, client: Node, server: Node, seconds: float = 2.0) -> float:
    """Received goodput (bits/s) of one TCP iperf3 test from client to server; the
    first 0.5 s is omitted so the slow start does not count."""
    listener = server.popen([iperf3, "-s", "-1", "-B", server.address],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + scaled(10)
        while True:  # retry until the server listens
            done = client.run([iperf3, "-c", server.address, "-t", str(seconds), "-O", "0.5",
                               "-J"], capture_output=True, text=True, timeout=scaled(30))
            report = json.loads(done.stdout or "{}")
            if "error" not in report and done.returncode == 0:
                return report["end"]["sum_received"]["bits_per_second"]
            if time.monotonic() > deadline:
                raise AssertionError(f"iperf3 failed: {report.get('error')} {done.stderr}")
            time.sleep(0.1)
    finally:
        listener.kill()
        listener.wait()


@contextmanager
def three_nodes(tag: str) -> Iterator[list[Node]]:
    with cluster(f"fce{os.getpid()}{tag}", 3, SUBNET) as nodes:
        yield nodes
