"""The house rules of the layout, checked: policy/ is pure, the daemon side runs
without torch, nothing but the CLI imports the agent, the agent's parts are
handed what they use (only its server knows the Agent), no folder's files
import each other in a circle, and every test that skips does so through the
one rule (support.privilege.skip_or_fail)."""

from __future__ import annotations

import ast
import json
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
    # Every attempt to import torch is refused and recorded, so a module that
    # tries it inside `try: ... except ImportError` is caught too.
    blocker = (
        "import sys, importlib.abc, json, traceback\n"
        "attempts = []\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            importer = [f for f in traceback.extract_stack() if not f.filename.startswith('<')][-1]\n"
        "            attempts.append(f'{name} from {importer.filename}:{importer.lineno}')\n"
        "            raise ImportError('torch is blocked: the daemon side must not need it')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import importlib\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "importlib.import_module('flexcomm.cli').build_parser()\n"  # what every command, the agent's too, runs
        "print(json.dumps({'attempts': attempts, 'loaded': sorted(sys.modules)}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["attempts"] == [], "the daemon side tried to import torch"
    assert set(modules) <= set(result["loaded"])


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


SKIP_CALLS = {"skip", "importorskip", "skipif", "xfail"}  # pytest.X(...) and pytest.mark.X


def skip_calls_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    # pytest.skip.Exception names the exception a skip raises: not a skip
    qualified = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return [f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in SKIP_CALLS and id(node) not in qualified]


def test_every_skip_goes_through_the_one_rule() -> None:
    rule = ROOT / "tests" / "support" / "privilege.py"
    found = [hit for path in sorted((ROOT / "tests").rglob("*.py")) if path != rule for hit in skip_calls_in(path)]
    assert found == [], "skip through support.privilege.skip_or_fail, which fails where CI demands the test"


def test_a_kernel_feature_excuses_a_skip_only_where_the_kernel_was_built_without_it(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    import gzip

    from support import privilege

    config = tmp_path / "config.gz"
    with gzip.open(config, "wt") as f:
        f.write("CONFIG_NET_SCH_HTB=y\n# CONFIG_NET_SCH_NETEM is not set\nCONFIG_NET_SCH_TBF=m\n")
    monkeypatch.setattr(privilege, "KERNEL_CONFIG", str(config))
    monkeypatch.setattr(privilege, "REQUIRE_PRIVILEGED", True)
    with pytest.raises(pytest.skip.Exception, match="built without CONFIG_NET_SCH_NETEM"):
        privilege.skip_or_fail("no netem", kernel_option="CONFIG_NET_SCH_NETEM")
    for option in ("CONFIG_NET_SCH_TBF", "CONFIG_NET_SCH_HTB", None):  # built (as a module): a setup fault
        with pytest.raises(pytest.fail.Exception, match="FLEXCOMM_REQUIRE_PRIVILEGED=1 but: missing"):
            privilege.skip_or_fail("missing", kernel_option=option)
    monkeypatch.setattr(privilege, "KERNEL_CONFIG", str(tmp_path / "none.gz"))  # unknown: not excused
    with pytest.raises(pytest.fail.Exception):
        privilege.skip_or_fail("no netem", kernel_option="CONFIG_NET_SCH_NETEM")
    monkeypatch.setattr(privilege, "REQUIRE_PRIVILEGED", False)
    with pytest.raises(pytest.skip.Exception):
        privilege.skip_or_fail("no root")
