"""The one rule for skipping: a test that cannot run here skips saying why, except
under FLEXCOMM_REQUIRE_PRIVILEGED=1 (exported by .ci/run), where it fails.

A test that needs a kernel feature names its build option: then the skip stands
under FLEXCOMM_REQUIRE_PRIVILEGED=1 too, but only when the running kernel's own
build configuration (/proc/config.gz) says it was built without it, which no
amount of privilege can change. Anything less certain fails there."""

from __future__ import annotations

import gzip
import os

import pytest

REQUIRE_PRIVILEGED = os.environ.get("FLEXCOMM_REQUIRE_PRIVILEGED") == "1"
KERNEL_CONFIG = "/proc/config.gz"


def kernel_built_without(option: str) -> bool:
    """True only when the kernel's build configuration says `option` is not set."""
    try:
        with gzip.open(KERNEL_CONFIG, "rt") as f:
            return any(line.strip() == f"# {option} is not set" for line in f)
    except OSError:
        return False


def skip_or_fail(reason: str, kernel_option: str | None = None) -> None:
    """Skip with `reason`, or fail if the environment demands privileged tests run
    (unless the kernel was built without `kernel_option`)."""
    if kernel_option and kernel_built_without(kernel_option):
        pytest.skip(f"{reason} (the kernel was built without {kernel_option})")
    if REQUIRE_PRIVILEGED:
        pytest.fail(f"FLEXCOMM_REQUIRE_PRIVILEGED=1 but: {reason}")
    pytest.skip(reason)
