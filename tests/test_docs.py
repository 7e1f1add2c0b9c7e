"""The docs stand alone and name what the code has: docs/CONFIGURATION.md
documents every policy option, agent setting and metric; docs/DEPLOYMENT.md and
the Kubernetes manifest name only real settings; every link in README.md and
docs/ leads to a file of this repository, the deployment guide among them."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from flexcomm.agent.config import ENV_PREFIX, AgentConfig
from flexcomm.agent.metrics import Metrics
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


def table_keys(text: str) -> set[str]:
    """Every `name` in the first cell of a Markdown table row."""
    keys = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([a-z0-9_]+)`", line.split("|")[1]))
    return keys


def test_every_agent_setting_is_documented() -> None:
    agent_section = CONFIG[CONFIG.index("## Agent"):]
    rows = [line for line in agent_section.splitlines() if line.startswith("| `")]
    missing = [f.name for f in fields(AgentConfig) if not any(f"`{f.name}`" in row.split(" | ")[0] for row in rows)]
    assert not missing, f"docs/CONFIGURATION.md's agent table lacks {missing}"


def test_every_metric_is_documented() -> None:
    names = {m.name.removesuffix("_total") for m in Metrics().registry.collect()}
    documented = {n.removesuffix("_total") for n in table_keys(CONFIG)}
    assert names and not names - documented, f"undocumented metrics: {sorted(names - documented)}"


@pytest.mark.parametrize("path", ["docs/DEPLOYMENT.md", "deploy/kubernetes/flexcomm-agent.yaml", "README.md"])
def test_deployment_uses_only_real_settings(path: str) -> None:
    settings = {f.name for f in fields(AgentConfig)}
    named = {v[len(ENV_PREFIX):].lower() for v in re.findall(rf"{ENV_PREFIX}[A-Z0-9_]+", (ROOT / path).read_text())}
    assert not named - settings, f"{path} names settings the agent does not have: {sorted(named - settings)}"


def test_the_readme_links_the_deployment_guide() -> None:
    assert "(docs/DEPLOYMENT.md)" in (ROOT / "README.md").read_text()
