"""A policy's settings by name, or the error every promotion entry point raises for an unknown one."""

from __future__ import annotations

from apprentice.settings import PolicySettings, Settings

__all__ = ["PolicyNotConfigured", "policy_settings"]


class PolicyNotConfigured(LookupError):
    def __init__(self, policy: str) -> None:
        super().__init__(f"policy {policy!r} is not configured (policies: in the config file)")


def policy_settings(settings: Settings, name: str) -> PolicySettings:
    policy = settings.policy(name)
    if policy is None:
        raise PolicyNotConfigured(name)
    return policy
