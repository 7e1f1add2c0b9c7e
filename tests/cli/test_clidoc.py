"""docs/CLI.md is what the parsers say (regenerate: python -m flexcomm.clidoc > docs/CLI.md)."""

from __future__ import annotations

from pathlib import Path

from flexcomm.clidoc import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "CLI.md"


def test_cli_reference_is_current() -> None:
    assert DOC.read_text() == render(), "docs/CLI.md is stale: run python -m flexcomm.clidoc > docs/CLI.md"
