"""docs/CONFIGURATION.md documents every policy option the code accepts."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from flexcomm.policy.gravac import GravacConfig
from flexcomm.policy.moo import MooConfig

CONFIG = (Path(__file__).resolve().parents[1] / "docs" / "CONFIGURATION.md").read_text()


@pytest.mark.parametrize("cls", [MooConfig, GravacConfig], ids=lambda c: c.__name__)
def test_every_policy_option_is_documented(cls: type) -> None:
    missing = [f.name for f in fields(cls) if f"| `{f.name}` | `" not in CONFIG]
    assert not missing, f"docs/CONFIGURATION.md lacks {missing}"
