"""Running the lab from a test file on its own namespace prefix and subnet (files
run side by side), and checking that a run left nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from flexcomm.lab.netns import list_namespaces
from support.waiting import scaled


def processes_mentioning(text: str) -> list[str]:
    """Every other process whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


@dataclass(frozen=True)
class LabRuns:
    """`flexcomm lab run` with two nodes on namespaces named `prefix`... in `subnet`."""

    prefix: str
    subnet: str

    def argv(self, out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "flexcomm.cli", "lab", "run", "--out", str(out),
                "--nodes", "2", "--prefix", self.prefix, "--subnet", self.subnet, *extra]

    def run_ok(self, out: Path, *extra: str, timeout: float) -> tuple[str, dict]:
        """Run the lab to the end; its stdout and summary."""
        proc = subprocess.run(self.argv(out, *extra), capture_output=True, text=True, timeout=scaled(timeout))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return proc.stdout, json.loads((out / "summary.json").read_text())

    def assert_nothing_left(self, out: Path) -> None:
        assert [ns for ns in list_namespaces() if ns.startswith(self.prefix)] == []
        assert processes_mentioning(str(out)) == []  # ranks and agents name the run dir
        # Every link end's qdisc was restored (Revert deletes its record) before its
        # namespace went away.
        assert list((out / "emulation-state").glob("*.json")) == []
