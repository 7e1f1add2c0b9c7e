"""The test harness itself (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys


def test_a_process_a_test_starts_hears_ctrl_c():
    # Several tests stop what they started with SIGINT; a suite started in the
    # background by a script would otherwise hand them SIGINT ignored.
    probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr
