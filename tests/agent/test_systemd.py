"""The systemd unit: systemd-analyze verify accepts it (with ExecStart pointed at
this checkout's flexcomm), and it asks for what the issue asks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from support.privilege import skip_or_fail

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "flexcomm-agent.service"


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def verify(tmp_path: Path, text: str) -> str:
    flexcomm = Path(sys.executable).with_name("flexcomm")
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace("/usr/local/bin/flexcomm", str(flexcomm)))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                         timeout=60)
    # verify exits 0 on some parse errors (it ignores the line): its words count too.
    return "" if out.returncode == 0 and UNIT.name not in out.stdout + out.stderr else (
        f"rc={out.returncode}: {out.stdout}{out.stderr}")


def test_unit_asks_for_what_the_agent_needs() -> None:
    d = directives(UNIT.read_text())
    assert d["Type"] == ["notify"] and d["Restart"] == ["on-failure"]
    assert d["WatchdogSec"] and d["StateDirectory"] == ["flexcomm"] and d["RuntimeDirectory"] == ["flexcomm"]
    assert d["CapabilityBoundingSet"] == ["CAP_NET_ADMIN"] == d["AmbientCapabilities"]
    for hardening in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp",
                      "RestrictAddressFamilies", "SystemCallFilter"):
        assert hardening in d, hardening


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        skip_or_fail("needs systemd-analyze (systemd) to verify the unit")
    assert verify(tmp_path, UNIT.read_text()) == ""
    # The check can fail: a broken line is caught.
    assert "service type" in verify(tmp_path, UNIT.read_text().replace("Type=notify", "Type=bogus"))
