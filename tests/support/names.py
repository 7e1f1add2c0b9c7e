"""Names a test run owns: two suites at once (two checkouts, CI beside a developer)
never share a network namespace, nor clean up each other's."""

from __future__ import annotations

import os


def run_prefix(tag: str) -> str:
    """`tag` made this run's own: "<tag><pid>-". The trailing dash keeps one run's
    prefix from being the start of another's (pid 12 vs 123), since cleanups
    match namespaces by prefix."""
    return f"{tag}{os.getpid()}-"
