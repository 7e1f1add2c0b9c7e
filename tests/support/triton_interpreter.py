"""Triton kernels checked without a GPU: a child process under TRITON_INTERPRET=1
(numpy on the host; the interpreter is chosen when the kernels are compiled, so
not in this process). Triton comes with the dev extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from flexcomm.client.candidates import triton_available
from support.privilege import skip_or_fail


def run_interpreted(code: str, timeout: float = 300) -> object:
    """Run `code` under Triton's interpreter; what its last printed line says (JSON)."""
    if not triton_available():
        skip_or_fail("Triton is not installed (flexcomm[dev] brings it on x86_64 Linux)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
