"""Signalling the process group a child leads, safely.

A child started in a session of its own leads a process group whose id is its
pid. Once the child is reaped, that number is free: the kernel may give it to a
new process, which (started in its own session, as the lab's and the agent's
children are) leads a group with that same id. Signalled then, the group would be
someone else's. So a group is signalled only while its leader is not reaped: an
exited leader left unreaped (a zombie) still holds the number. On the suite's
host (pid_max 32768, wrapped within a run) a lab cluster's stop signalled the
groups of children it had reaped long before, the likely way one test's process
was once killed by another's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

POLL_S = 0.01


def signal_group(proc: subprocess.Popen, sig: int) -> bool:
    """Send `sig` to the group `proc` leads, unless `proc` was reaped (then its
    group's id may be another's); whether it was sent."""
    if proc.returncode is not None:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    return True


def exited(proc: subprocess.Popen, timeout_s: float | None) -> bool:
    """Whether `proc` exited within `timeout_s` (None: wait until it does), left
    unreaped so that its group may still be signalled."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while proc.returncode is None:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:  # reaped by another wait meanwhile
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def end_group(proc: subprocess.Popen, grace_s: float, first: int) -> None:
    """End the group `proc` leads: `first` to it, SIGKILL where `proc` has not
    exited within `grace_s`, SIGKILL to what is left of the group, then reap
    `proc`. Every signal goes while `proc` is unreaped."""
    signal_group(proc, first)
    if not exited(proc, grace_s):
        signal_group(proc, signal.SIGKILL)
        exited(proc, None)
    signal_group(proc, signal.SIGKILL)  # stragglers left in the group
    proc.wait()
