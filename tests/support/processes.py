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


def alive(pid: int) -> bool:
    """Whether `pid` runs (exists and is no zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def describe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def end(pid: int, grace_s: float = 2.0) -> None:
    """SIGTERM `pid`, and its whole process group when it leads one of its own
    (lab runs and gloo ranks start new sessions), so that an agent or a lab run
    restores what it shaped; SIGKILL it if it is still there after `grace_s`;
    then reap it."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            if os.getpgid(pid) == pid and pid != os.getpgrp():
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return
        if _reaped(pid, wait_s):
            return


def _reaped(pid: int, wait_s: float) -> bool:
    """Whether `pid` exited (and was reaped) within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return True
        except ChildProcessError:  # reaped by its Popen meanwhile
            return True
        time.sleep(0.01)
    return False
