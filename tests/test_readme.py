"""The README's configuration example is a working configuration."""

from __future__ import annotations

import yaml

from apprentice.settings import Settings
from tests.support.processes import REPO_ROOT


def test_readme_configuration_example_loads(monkeypatch):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "APPRENTICE_ADMIN_KEY", "WEBHOOK_SECRET"):
        monkeypatch.setenv(name, "value")
    text = (REPO_ROOT / "README.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    settings = Settings(**yaml.safe_load(block))
    assert settings.policies[0].name == "support-agent"
    assert settings.router_settings.fallbacks_for("gpt-4o-mini") == ["claude"]
    assert settings.rewards.webhook_secrets[0].tenant == "acme"
