"""Run a function on N real gloo ranks (separate processes on loopback) and collect results.

    results = run_ranks(world, "client/test_hook.py:battery", args={...}, timeout=120)

`target` is a test file (relative to tests/) and a function in it. Each rank is
a fresh `python tests/support/client_ranks.py ...` process: it joins a gloo group
through a FileStore in a temporary folder (no port to race for; gloo's own
sockets bind to 127.0.0.1), calls `function(rank, world, **args)`, and
torch.saves what it returns. A rank that fails or a group that overruns `timeout`
(scaled to the host's load, support/waiting.py) fails the test with every rank's
stderr tail; processes left over are killed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from support.waiting import scaled

TESTS_DIR = Path(__file__).resolve().parents[1]


def run_ranks(world: int, target: str, args: dict[str, Any] | None = None,
              timeout: float = 120.0) -> list[Any]:
    import torch

    with tempfile.TemporaryDirectory(prefix="flexcomm-ranks-") as tmp:
        tmpdir = Path(tmp)
        torch.save(args or {}, tmpdir / "args.pt")
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]))
        procs = []
        for rank in range(world):
            err = open(tmpdir / f"stderr.{rank}", "w")  # noqa: SIM115 (closed below)
            procs.append((subprocess.Popen(
                [sys.executable, str(Path(__file__)), target, str(rank), str(world), tmp],
                env=env, stdout=err, stderr=subprocess.STDOUT, start_new_session=True,
            ), err))
        limit = scaled(timeout)
        try:
            _wait_all(procs, limit)
        except TimeoutError:
            raise AssertionError(
                f"{target} on {world} ranks did not finish in {limit:.0f}s (hang?)\n"
                + _tails(tmpdir, world)) from None
        finally:
            _kill(procs)
        failed = [r for r, (p, _) in enumerate(procs) if p.returncode != 0]
        if failed:
            raise AssertionError(f"{target}: ranks {failed} failed\n" + _tails(tmpdir, world))
        return [torch.load(tmpdir / f"result.{r}.pt", weights_only=False) for r in range(world)]


def _wait_all(procs, timeout: float) -> None:
    """Wait for every rank; stop early when one fails (the others would hang)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p, _ in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            return
        time.sleep(0.05)
    raise TimeoutError


def _kill(procs) -> None:
    for proc, err in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err.close()


def _tails(tmpdir: Path, world: int) -> str:
    out = []
    for r in range(world):
        text = (tmpdir / f"stderr.{r}").read_text(errors="replace")
        out.append(f"--- rank {r} ---\n{text[-3000:]}")
    return "\n".join(out)


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"ranks_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main() -> None:
    target, rank, world, tmp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    file_name, func_name = target.split(":")
    func = getattr(_load(TESTS_DIR / file_name), func_name)
    args = torch.load(tmp / "args.pt", weights_only=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=rank,
                            world_size=world)
    try:
        result = func(rank, world, **args)
    finally:
        dist.destroy_process_group()
    torch.save(result, tmp / f"result.{rank}.pt")
    # Skip interpreter finalisation: there, now and then, gloo's C++ threads are
    # torn down after Python (SIGABRT, "terminate called without an active
    # exception"; pytorch/pytorch#179291), once every ~10 runs of the 4-rank
    # hook battery here, always after the result was saved.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _main()
