"""`flexcomm lab clean`: remove what a crashed lab command left behind.

A lab command (`lab run`, `lab calibrate`) leaves, when killed: network
namespaces named with its prefix, processes it started (ranks, agents, their
iperf3 servers; in those namespaces or, on loopback, in this one), and a short
directory for the agents' sockets. Every process the lab starts carries
FLEXCOMM_LAB_PREFIX=<prefix> in its environment (children inherit it), which is
how they are found wherever they run. `clean(prefix)` kills them (SIGTERM, then
SIGKILL), deletes the namespaces (their veths and qdiscs go with them) and the
socket directories. Lab commands never shape an interface outside their own
namespaces, so nothing else needs restoring. A new cluster runs `clean` for its
own prefix before it starts, so a crashed run's leftovers never meet it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from flexcomm.lab import netns

LAB_ENV = "FLEXCOMM_LAB_PREFIX"
# Prefixes of the lab's commands: `lab run` and `lab calibrate` (their --prefix defaults).
DEFAULT_PREFIXES = ("flexlab", "flexcal")


def socket_dir_prefix(prefix: str) -> str:
    """What the name of a lab command's socket directory (in the temp dir) starts with."""
    return f"{prefix}-sockets-"


def namespace_pids(ns: str) -> list[int]:
    try:
        out = netns.ip("netns", "pids", ns)
    except netns.NetnsError:
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def marked_pids(prefix: str) -> list[int]:
    """Processes started by a lab command with `prefix` (by their environment),
    never this process or its ancestors."""
    mark = f"{LAB_ENV}={prefix}".encode()
    spared = _ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def kill_all(pids: Iterable[int], still_there: Callable[[], list[int]], grace_s: float = 2.0) -> list[int]:
    """SIGTERM `pids`, SIGKILL what `still_there()` lists after `grace_s`."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while still_there() and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in still_there():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def kill_namespace_processes(ns: str, grace_s: float = 2.0) -> list[int]:
    """SIGTERM every process in `ns`, SIGKILL those left after `grace_s`."""
    return kill_all(namespace_pids(ns), lambda: namespace_pids(ns), grace_s)


def clean(prefix: str) -> dict[str, list]:
    """Kill the processes of, then delete the namespaces and socket directories
    of, every lab command with `prefix`."""
    if not prefix:
        raise ValueError("prefix: must not be empty (it would match every namespace)")
    killed = kill_all(marked_pids(prefix), lambda: marked_pids(prefix))
    namespaces: list[str] = []
    if shutil.which("ip") is not None:
        mine = [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]
        for ns in mine:
            killed.extend(kill_namespace_processes(ns))
        namespaces = netns.destroy_prefix(prefix) if mine else []
    return {"namespaces": namespaces, "processes": sorted(set(killed)),
            "directories": _remove_socket_dirs(prefix)}


def _remove_socket_dirs(prefix: str) -> list[str]:
    gone = []
    for path in Path(tempfile.gettempdir()).glob(f"{socket_dir_prefix(prefix)}*"):
        if path.is_dir() and all(p.is_socket() for p in path.iterdir()):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(str(path))
    return gone
