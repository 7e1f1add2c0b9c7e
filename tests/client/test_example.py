"""examples/train_ddp.py runs under torchrun on 2 CPU (gloo) ranks and learns."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
def test_example_trains_under_torchrun_with_the_hook():
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", str(ROOT / "examples/train_ddp.py"),
         "--compression", "topk:0.01", "--collective", "art_ring", "--root", "var", "--steps", "150"],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(r"step  149 loss [0-9.]+ topk:0.01@art_ring ", proc.stdout), proc.stdout
    acc = float(re.search(r"accuracy ([0-9.]+)", proc.stdout).group(1))
    assert acc > 0.6, proc.stdout  # 10 classes: chance is 0.1
