"""The house rules of the layout, checked: policy/ is pure, the daemon side runs
without torch, nothing but the CLI imports the agent, the agent's parts are
handed what they use (only its server knows the Agent), and no folder's files
import each other in a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DAEMON_SIDE = ("policy", "probe", "emulation", "store", "agent", "proto")
# Each folder is one part, imported as flexcomm.<name> (flexcomm/ itself is the CLI).
PARTS = {"policy": "flexcomm.policy", "probe": "flexcomm.probe", "emulation": "flexcomm.emulation",
         "store": "flexcomm.store", "agent": "flexcomm.agent", "proto": "flexcomm.proto",
         "client": "flexcomm.client", "lab": "flexcomm.lab", "flexcomm": "flexcomm",
         "flexcomm/commands": "flexcomm.commands"}
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


def test_only_the_server_knows_the_agent() -> None:
    """Every other agent module is handed what it uses (a network model, metrics,
    a callback), never the Agent that owns them all."""
    for path in py_files("agent"):
        if path.name != "server.py":
            bad = [n for n in imports_of(path) if n == "flexcomm.agent.server"]
            assert not bad, f"agent/{path.name} imports the Agent's module"


def sibling_imports(path: Path, package: str, siblings: set[str]) -> set[str]:
    """The modules of `package` (by file stem; names defined by the package itself
    are "__init__") that `path` imports anywhere in its code (type-checking
    imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == package:
            found.update(a.name if a.name in siblings else "__init__" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(_sibling(node.module, package, siblings))
        elif isinstance(node, ast.Import):
            for a in node.names:
                found.update(_sibling(a.name, package, siblings))
    return found - {path.stem}


def _sibling(module: str, package: str, siblings: set[str]) -> set[str]:
    if module == package:
        return {"__init__"}
    first = module[len(package) + 1:].split(".")[0] if module.startswith(package + ".") else ""
    return {first} if first in siblings else set()


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle in `graph` (a list that starts and ends with the same node), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (circle := visit(nxt, [*path, nxt])):
                return circle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (circle := visit(start, [start])):
            return circle
    return None


@pytest.mark.parametrize("folder", sorted(PARTS))
def test_no_import_circle_within_a_folder(folder: str) -> None:
    files = sorted((ROOT / folder).glob("*.py"))
    siblings = {p.stem for p in files}
    graph = {p.stem: sibling_imports(p, PARTS[folder], siblings) for p in files if "_pb2" not in p.name}
    # A package's __init__ re-exports its modules; a module importing the package
    # itself would close a circle through it.
    assert import_circle(graph) is None, f"{folder}/: {' -> '.join(import_circle(graph) or [])}"


def test_the_circle_check_sees_a_circle() -> None:
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
