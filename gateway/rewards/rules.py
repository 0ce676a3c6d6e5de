"""What a policy accepts as a reward: its `reward_range` and, when declared, its metric names."""

from __future__ import annotations

from dataclasses import dataclass

from apprentice.settings import PolicySettings, Settings

# The reward the learner trains on; other names are extra measurements a policy may declare.
DEFAULT_REWARD_NAME = "reward"


@dataclass(frozen=True, slots=True)
class Problem:
    field: str  # relative to the reward: "reward", "metrics.<name>", "name"
    message: str


class RewardRules:
    def __init__(self, settings: Settings) -> None:
        self.policies: dict[str, PolicySettings] = {policy.name: policy for policy in settings.policies}

    def check(self, policy_name: str | None, name: str, value: float, metrics: dict[str, float]) -> Problem | None:
        """None when the trajectory's policy accepts the reward (models that are no policy accept any)."""
        policy = self.policies.get(policy_name) if policy_name else None
        if policy is None:
            return None
        if policy.reward_range is not None:
            low, high = policy.reward_range
            if not low <= value <= high:
                return Problem(
                    "reward", f"{value!r} is outside the reward_range [{low:g}, {high:g}] of policy {policy.name!r}"
                )
        if policy.metrics is not None:
            allowed = set(policy.metrics)
            if name != DEFAULT_REWARD_NAME and name not in allowed:
                return Problem(
                    "name",
                    f"{name!r} is not a metric of policy {policy.name!r} "
                    f"(declared: {', '.join(sorted(allowed)) or 'none'})",
                )
            for metric in metrics:
                if metric not in allowed:
                    return Problem(
                        f"metrics.{metric}",
                        f"unknown metric {metric!r} for policy {policy.name!r} "
                        f"(declared: {', '.join(sorted(allowed)) or 'none'})",
                    )
        return None
