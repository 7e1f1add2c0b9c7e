"""Running `flexcomm` as a user does, and the one shape of a user-fixable error:
exit status 2 and one line, `flexcomm <command>: error: <setting or file>: <what>`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.waiting import scaled

REPO = Path(__file__).resolve().parents[2]


def flexcomm(args: Sequence[str], env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process (`env`: its whole environment, default ours)."""
    return subprocess.run([sys.executable, "-m", "flexcomm.cli", *args], env=env,
                          capture_output=True, text=True, timeout=scaled(60), cwd=REPO, **kwargs)


def assert_one_line_error(proc: subprocess.CompletedProcess, command: str, starts: str) -> str:
    """The error line, after checking exit 2, one line on stderr, no traceback."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    prefix = f"flexcomm {command}: error: {starts}"
    assert lines[0].startswith(prefix), f"{lines[0]!r} does not start with {prefix!r}"
    return lines[0]
