"""The wheel as a user gets it: built from a clean copy of the tree (the files git
tracks, nothing built here), installed with its client and agent extras into a
new virtual environment, it holds every module of every mapped folder, runs
`flexcomm --help`, imports every module (but the framework integrations, which
need Lightning or Accelerate, not declared by any extra: the job brings its own;
and the radix select's Triton kernels, which come with CUDA builds of torch and
are imported only where Triton is), and trains two gloo ranks through the hook with the one-line form.

torch comes pinned (torch==2.13.0, the CPU wheel the bootstrap installs): the
extra's bare range would let pip pull the CUDA build. pip's cache makes the
install quick once the bootstrap has run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from support.agent_process import free_port

# A venv with torch unpacked from pip's cache: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
NEEDS_MORE = ("flexcomm.client.integrations.", "flexcomm.client.radix_kernels")
sys.path.insert(0, str(ROOT))
from setup import MAPPED  # noqa: E402  (the package mapping the build uses)

sys.path.remove(str(ROOT))

TRAIN = """
import sys
import torch, torch.distributed as dist
import flexcomm

dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
model = torch.nn.parallel.DistributedDataParallel(net)
state = flexcomm.register(model, control_interval=2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(dist.get_rank())
teacher = torch.nn.Linear(32, 4)
losses = []
for step in range(30):
    x = torch.randn(32, 32, generator=gen)
    loss = torch.nn.functional.cross_entropy(model(x), teacher(x).argmax(1).detach())
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
if dist.get_rank() == 0:
    print("from", flexcomm.__file__)
    print("trained", state.summary()["steps"], losses[0], losses[-1])
dist.destroy_process_group()
"""


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"{time.monotonic() - started:6.1f}s  {' '.join(cmd[:4])[-100:]}")  # each phase's time, with -s
    assert done.returncode == 0, (f"{' '.join(cmd)} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def clean_copy(dest: Path) -> list[str]:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    tracked = [f for f in files.decode().split("\0") if f and (ROOT / f).is_file()]
    for name in tracked:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    return tracked


def module_name(path: str) -> str | None:
    """The installed module a tracked file of a mapped folder becomes, else None."""
    for package, folder in MAPPED.items():
        if path.startswith(folder + "/") and path.endswith(".py"):
            inner = path[len(folder) + 1 : -3].replace("/", ".")
            return package if inner == "__init__" else f"{package}.{inner.removesuffix('.__init__')}"
    return None


def test_the_wheel_installs_and_trains(tmp_path: Path) -> None:
    src, dist, work = tmp_path / "src", tmp_path / "dist", tmp_path / "work"
    for d in (src, dist, work):
        d.mkdir()
    tracked = clean_copy(src)
    modules = sorted({m for m in map(module_name, tracked) if m is not None})

    # The build backend of this environment (pyproject's build requirement) instead of
    # an isolated one installed afresh: the wheel is the same, the test a minute quicker.
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
         str(src)], cwd=work)
    (wheel,) = dist.glob("flexcomm-*.whl")
    inside = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in zipfile.ZipFile(wheel).namelist()
              if n.endswith(".py")}
    missing = [m for m in modules if m not in inside]
    assert not missing, f"modules left out of the wheel: {missing}"

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=work)
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", TORCH,
         f"{wheel}[client,agent]"], cwd=work)

    assert "usage: flexcomm" in run([str(venv / "bin" / "flexcomm"), "--help"], cwd=work)
    plain = [m for m in modules if not m.startswith(NEEDS_MORE)]
    imported = run([str(py), "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
                    "import flexcomm; print(flexcomm.__file__)", *plain], cwd=work)
    assert str(venv) in imported, f"flexcomm came from {imported!r}, not the new environment"

    (work / "train.py").write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FLEXCOMM_"))}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               FLEXCOMM_AGENT_SOCKET=str(tmp_path / "no-agent.sock"))
    out = run([str(venv / "bin" / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), "train.py"], cwd=work, env=env)
    assert f"from {venv}" in out
    trained = re.search(r"^trained (\d+) (\S+) (\S+)$", out, re.M)
    assert trained and trained.group(1) == "30" and float(trained.group(3)) < float(trained.group(2)), out
