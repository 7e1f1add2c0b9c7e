"""`flexcomm lab clean`: remove what a crashed lab left behind.

For every namespace whose name starts with the prefix: kill the processes still
running in it (ranks, agents, iperf3 servers), then delete it (its veths and
their qdiscs go with it). Lab runs never shape an interface outside their own
namespaces, so nothing else needs restoring.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from flexcomm.lab import netns


def namespace_pids(ns: str) -> list[int]:
    try:
        out = netns.ip("netns", "pids", ns)
    except netns.NetnsError:
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace_processes(ns: str, grace_s: float = 2.0) -> list[int]:
    """SIGTERM every process in `ns`, SIGKILL those left after `grace_s`."""
    pids = namespace_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while namespace_pids(ns) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in namespace_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def clean(prefix: str) -> dict[str, list]:
    """Kill processes in, then delete, every namespace starting with `prefix`."""
    if not prefix:
        raise ValueError("prefix: must not be empty (it would match every namespace)")
    mine = [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]
    killed: list[int] = []
    for ns in mine:
        killed.extend(kill_namespace_processes(ns))
    return {"namespaces": netns.destroy_prefix(prefix), "processes": killed}
