"""Shared test fixtures.

Tests that need root and network namespaces are marked `privileged` and use the
`privileged` fixture: they skip (saying why) when not root, but under
FLEXCOMM_REQUIRE_PRIVILEGED=1 (exported by .ci/run) such a skip is a failure.

Every test ends the processes it started (`no_process_left_behind`) and they
write their temporary files under pytest's base folder, the
processes it starts hear Ctrl-C however the run was started (`pytest_configure`), and every
deadline, pytest-timeout's included, is scaled to the host's load
(support/waiting.py): a busy machine makes the suite slower, not red.
"""

from __future__ import annotations

import os
import shutil
import signal
import warnings
from collections.abc import Iterator

import pytest

from support.privilege import skip_or_fail
from support.processes import children, describe, end
from support.waiting import scaled


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C's usual effect in this run and every process it starts. A runner
    started in the background by a script (`make test &`) begins with SIGINT
    ignored and hands that to its children, where Python then installs no
    KeyboardInterrupt: the tests' own Ctrl-C to a run they started went unheard."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> object:
    """pytest-timeout's timer, with the test's timeout scaled to the host's load."""
    from pytest_timeout import pytest_timeout_set_timer as set_timer

    return set_timer(item, settings._replace(timeout=scaled(settings.timeout)))


@pytest.fixture(autouse=True, scope="session")
def children_write_temporary_files_under_pytests_own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """$TMPDIR for every process the tests start: torchrun leaves a
    `torchelastic_*` folder in the temporary directory per run (91 in /tmp after a
    few suites); under pytest's base folder they go with its old runs."""
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("children-tmp"))
    yield
    if before is None:
        os.environ.pop("TMPDIR")
    else:
        os.environ["TMPDIR"] = before


@pytest.fixture(autouse=True)
def no_process_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """A child process started during the test (by it or its function-scoped
    fixtures) and still running when it ends is killed, with its session, and
    named in a warning: a test that fails half-way leaves nothing running."""
    before = children()
    yield
    left = children() - before
    for pid in left:
        what = describe(pid)
        end(pid)
        warnings.warn(f"{request.node.nodeid} left process {pid} running ({what[:200]}); killed it", stacklevel=1)


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
