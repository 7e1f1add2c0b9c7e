"""`make gpu-check` (bench/gpu_check.py) as far as this machine can run it: with no
GPU it says so and exits 0; with `--device cpu` its training checks (every family
and collective on 3 gloo ranks, identical parameters, dense bit for bit as
PyTorch's allreduce_hook, the per-bucket work under no_host_sync) pass on CPU
tensors. 3 ranks, because dividing by 2 is exact: with 2 a dense path that
divided after summing would still match PyTorch's hook bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.privilege import skip_or_fail

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def run(*args: str, hide_gpus: bool = False, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=240, env=env)


def test_without_a_gpu_it_says_so_and_passes(tmp_path):
    done = run(hide_gpus=True, path=str(tmp_path))  # no nvidia-smi on PATH either
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("gpu-check: no CUDA device on this machine")
    assert json.loads(lines[-1]) == {"gpu": False, "checked": False}


def test_a_gpu_under_a_torch_without_cuda_is_refused_in_one_line(tmp_path):
    import torch

    if torch.version.cuda is not None:
        skip_or_fail("this torch is a CUDA build; the case is about CPU builds")
    # A stand-in nvidia-smi (this machine has no GPU) that lists one.
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    done = run(path=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"gpu-check: nvidia-smi lists 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)' but "
                                   f"this torch has no CUDA (torch {torch.__version__}, CUDA build none): install a "
                                   f"CUDA build of torch==2.13.0 into {sys.prefix}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_its_training_checks_pass_on_cpu_tensors():
    # The sampled sync-free selector, whose device path runs on CPU tensors too (the
    # radix select's kernels need a GPU, or Triton's interpreter: tests/client/test_radix.py).
    done = run("--device", "cpu", "--ranks", "3", "--steps", "3", "--selector", "sync_free")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["checked"] and summary["problems"] == []
    assert summary["options"] == 11


def test_bad_arguments_are_refused_in_one_line():
    done = run("--ranks", "1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("ranks: at least 2; steps: at least 3 "
                                                         "(one dense warm-up, then the option)")
