"""The examples of docs/USAGE.md run as written, on 2 CPU (gloo) ranks with no
agent on the node (so the one-line form decides with the MOO in-process): the
plain torchrun script with its checkpoint, Lightning with the real `lightning`
and Accelerate with the real `accelerate`. In each, the loss falls, rank 1 runs
the decisions rank 0's policy made, and a checkpoint brings every rank's hook
state back."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

pytestmark = pytest.mark.slow


def launch(argv: list[str], tmp_path: Path, timeout: float = 240) -> str:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               FLEXCOMM_AGENT_SOCKET=str(tmp_path / "no-agent.sock"))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def reports(out: str) -> dict[int, dict]:
    """Each rank's report: the JSON object after each marker. Both ranks share one
    stdout pipe and torchrun's children write unbuffered (the text and its newline
    apart), so one rank's report can run on into the other's on one line."""
    decoder = json.JSONDecoder()
    found = [decoder.raw_decode(chunk)[0] for chunk in out.split("flexcomm-report ")[1:]]
    return {r["rank"]: r for r in found}


def check_adapted(out: str, by_rank: dict[int, dict]) -> None:
    zero, one = by_rank[0], by_rank[1]
    assert zero["last_loss"] < 0.5 * zero["first_loss"], zero
    assert zero["version"] > 1 and (one["decision"], one["version"]) == (zero["decision"], zero["version"])
    summary = zero["summary"]
    assert len(summary["choices"]) > 1  # the MOO moved on from its warm-up
    assert summary["exploring_share"] * summary["steps"] <= 0.05 * max(summary["steps"], 100)  # its budget
    assert out.count("no flexcomm agent answers") >= 1
    changes = re.findall(r"adopted decision v\d+: (\S+) over (\w+)", out)
    assert len(changes) >= 2 and len(set(changes)) >= 2  # what the job chose, said by default


@pytest.mark.timeout(400)
def test_the_one_line_torchrun_example_trains_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    argv = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(ROOT / "examples/one_line.py"),
            "--steps", "50", "--checkpoint", str(tmp_path / "ckpt")]
    first = launch(argv, tmp_path)
    loss = re.search(r"loss ([0-9.]+) -> ([0-9.]+); now (\S+) \(v(\d+)\), step (\d+)", first)
    assert loss and float(loss.group(2)) < float(loss.group(1)) and loss.group(5) == "50", first[-2000:]
    assert int(loss.group(4)) > 1
    saved = [torch.load(tmp_path / "ckpt" / f"rank{r}.pt", weights_only=False)["flexcomm"]
             for r in (0, 1)]
    assert [s["controller"]["step"] for s in saved] == [50, 50]
    again = launch(argv, tmp_path)
    assert re.search(r"step 100\b", again), again[-2000:]  # each rank's state came back


@pytest.mark.timeout(400)
def test_lightning_with_the_callback_adapts_and_checkpoints_every_rank(tmp_path: Path) -> None:
    out = launch([sys.executable, str(ROOT / "examples/lightning_ddp.py"), "--devices", "2", "--steps", "120",
                  "--checkpoint", str(tmp_path / "fc.ckpt")], tmp_path, timeout=360)
    by_rank = reports(out)
    check_adapted(out, by_rank)
    for r in (0, 1):
        assert by_rank[r]["ranks_in_checkpoint"] == 2
        assert by_rank[r]["flexcomm_steps_after_resume"] == 20  # the restored counter went on


@pytest.mark.timeout(400)
def test_accelerate_with_the_helper_adapts_and_checkpoints_every_rank(tmp_path: Path) -> None:
    out = launch([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(ROOT / "examples/accelerate_ddp.py"),
                  "--steps", "120", "--checkpoint", str(tmp_path / "acc")], tmp_path, timeout=360)
    by_rank = reports(out)
    check_adapted(out, by_rank)
    for r in (0, 1):
        assert by_rank[r]["restored_step"] == by_rank[r]["saved_step"] == 120
