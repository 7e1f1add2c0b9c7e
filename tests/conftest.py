"""Shared test fixtures.

Tests that need root and network namespaces are marked `privileged` and use the
`privileged` fixture: they skip (saying why) when not root, but under
FLEXCOMM_REQUIRE_PRIVILEGED=1 (exported by .ci/run) such a skip is a failure.
"""

from __future__ import annotations

import os
import shutil

import pytest

from support.privilege import skip_or_fail


@pytest.fixture
def privileged() -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root to create network namespaces")
    if shutil.which("ip") is None:
        skip_or_fail("needs the `ip` command (iproute2)")
    if not os.path.exists("/proc/self/ns/net"):
        skip_or_fail("kernel has no network namespaces")


@pytest.fixture
def iperf3_binary() -> str:
    path = shutil.which("iperf3")
    if path is None:
        skip_or_fail("needs the iperf3 binary (apt-get install iperf3)")
    return path
