"""The one rule for skipping: a test that cannot run here skips saying why, except
under FLEXCOMM_REQUIRE_PRIVILEGED=1 (exported by .ci/run), where it fails."""

from __future__ import annotations

import os

import pytest

REQUIRE_PRIVILEGED = os.environ.get("FLEXCOMM_REQUIRE_PRIVILEGED") == "1"


def skip_or_fail(reason: str) -> None:
    """Skip with `reason`, or fail if the environment demands privileged tests run."""
    if REQUIRE_PRIVILEGED:
        pytest.fail(f"FLEXCOMM_REQUIRE_PRIVILEGED=1 but: {reason}")
    pytest.skip(reason)
