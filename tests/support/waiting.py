"""Waiting in tests: poll for the state a test needs, with deadlines scaled to how
busy the host is, so that a loaded machine makes a test slower, not red.

    wait_for(lambda: job_ids(agent) == {"alive"}, what="the idle job's expiry")
    proc.wait(scaled(10))

A deadline here is a hang detector, not a measurement: `scaled(s)` is `s` times
`time_factor()`, the host's 1-minute load per core (at least 1, at most
MAX_FACTOR) times $FLEXCOMM_TEST_TIME_SCALE (default 1; raise it on a slow
machine). The factor is read when a wait starts, so a wait begun under a hog
gets the hog's allowance.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

MAX_FACTOR = 8.0
T = TypeVar("T")


def time_factor() -> float:
    """How much longer than on a quiet machine a wait may take now."""
    try:
        with open("/proc/loadavg") as f:
            load = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        load = 0.0
    per_core = load / (os.cpu_count() or 1)
    scale = float(os.environ.get("FLEXCOMM_TEST_TIME_SCALE", "1") or 1)
    return min(MAX_FACTOR, max(1.0, per_core)) * max(1.0, scale)


def scaled(seconds: float) -> float:
    """`seconds` on a quiet machine, as a deadline on this host now."""
    return seconds * time_factor()


def wait_for(predicate: Callable[[], T], timeout_s: float = 20.0, what: str = "condition",
             interval_s: float = 0.02) -> T:
    """Poll `predicate` until it returns something true (returned), for at most
    scaled(timeout_s); the last look is after the deadline, so a poller preempted
    past it still sees the state."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what} ({scaled(timeout_s):.0f} s at load "
                                 f"x{time_factor():.1f})")
        time.sleep(interval_s)
