"""docs/CONFIGURATION.md documents every policy option and agent setting the code accepts."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from flexcomm.agent.config import AgentConfig
from flexcomm.policy.gravac import GravacConfig
from flexcomm.policy.moo import MooConfig

CONFIG = (Path(__file__).resolve().parents[1] / "docs" / "CONFIGURATION.md").read_text()


@pytest.mark.parametrize("cls", [MooConfig, GravacConfig], ids=lambda c: c.__name__)
def test_every_policy_option_is_documented(cls: type) -> None:
    missing = [f.name for f in fields(cls) if f"| `{f.name}` | `" not in CONFIG]
    assert not missing, f"docs/CONFIGURATION.md lacks {missing}"


def test_every_agent_setting_is_documented() -> None:
    agent_section = CONFIG[CONFIG.index("## Agent"):]
    rows = [line for line in agent_section.splitlines() if line.startswith("| `")]
    missing = [f.name for f in fields(AgentConfig) if not any(f"`{f.name}`" in row.split(" | ")[0] for row in rows)]
    assert not missing, f"docs/CONFIGURATION.md's agent table lacks {missing}"
