"""The processes a test started, and ending them: the suite's net under every
fixture that owns a process (tests/conftest.py), so that a test that fails
between starting an agent, an iperf3 or a lab run and stopping it leaves
nothing running."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def children(parent: int | None = None) -> set[int]:
    """Live (not zombie) child processes of `parent` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def describe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def end(pid: int) -> None:
    """SIGKILL `pid`, and its whole process group when it leads one of its own
    (lab runs and gloo ranks start new sessions); then reap it."""
    try:
        if os.getpgid(pid) == pid and pid != os.getpgrp():
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(500):  # SIGKILL is quick unless the kernel holds the process (D state)
        try:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return
        except ChildProcessError:  # reaped by its Popen meanwhile
            return
        time.sleep(0.01)
