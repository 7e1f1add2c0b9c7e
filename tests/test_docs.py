"""The docs stand alone: docs/CONFIGURATION.md documents every policy option and
agent setting the code accepts, and every link in README.md and docs/ leads to a
file of this repository."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from flexcomm.agent.config import AgentConfig
from flexcomm.policy.gravac import GravacConfig
from flexcomm.policy.moo import MooConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (ROOT / "docs" / "CONFIGURATION.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_into_the_repository(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), f"{doc.name} links {target}, not a file of this repository"


@pytest.mark.parametrize("cls", [MooConfig, GravacConfig], ids=lambda c: c.__name__)
def test_every_policy_option_is_documented(cls: type) -> None:
    missing = [f.name for f in fields(cls) if f"| `{f.name}` | `" not in CONFIG]
    assert not missing, f"docs/CONFIGURATION.md lacks {missing}"


def test_every_agent_setting_is_documented() -> None:
    agent_section = CONFIG[CONFIG.index("## Agent"):]
    rows = [line for line in agent_section.splitlines() if line.startswith("| `")]
    missing = [f.name for f in fields(AgentConfig) if not any(f"`{f.name}`" in row.split(" | ")[0] for row in rows)]
    assert not missing, f"docs/CONFIGURATION.md's agent table lacks {missing}"
