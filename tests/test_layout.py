"""The house rules of the layout, checked: policy/ is pure, the daemon side runs
without torch, and nothing but the CLI imports the agent."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DAEMON_SIDE = ("policy", "probe", "emulation", "store", "agent", "proto")
# Modules whose use would make the policy impure (I/O, clocks, randomness, torch).
IMPURE = {"os", "sys", "io", "time", "datetime", "random", "socket", "subprocess", "sqlite3", "pathlib",
          "threading", "asyncio", "torch", "numpy", "grpc", "logging", "shutil", "tempfile"}


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def py_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "_pb2" not in p.name)


@pytest.mark.parametrize("path", py_files("policy"), ids=lambda p: p.name)
def test_policy_is_pure(path: Path) -> None:
    for name in imports_of(path):
        top = name.split(".")[0]
        assert top not in IMPURE, f"{path.name} imports {name}"
        if name.startswith("flexcomm."):
            assert name.startswith("flexcomm.policy"), f"{path.name} imports {name}"


def test_only_the_cli_imports_the_agent() -> None:
    for folder in ("policy", "probe", "emulation", "store", "client", "proto", "lab"):
        for path in py_files(folder):
            bad = [n for n in imports_of(path) if n.startswith("flexcomm.agent")]
            assert not bad, f"{path} imports {bad}"


def test_daemon_side_imports_without_torch() -> None:
    modules = []
    for folder in DAEMON_SIDE:
        for path in py_files(folder):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            modules.append(".".join(["flexcomm", folder, *parts]))
    modules += ["flexcomm.cli", "flexcomm.commands.model", "flexcomm.commands.agent"]
    blocker = (
        "import sys, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked: the daemon side must not need it')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import importlib\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print('ok', len(sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch" not in proc.stdout
