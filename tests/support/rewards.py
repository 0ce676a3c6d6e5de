"""Rewards as the store's intake takes them (gateway/store/rewards.py), for tests that drive it directly."""

from __future__ import annotations

import uuid

from gateway.store.rewards import NewReward


def trajectory_reward(
    trajectory: uuid.UUID, *, key: str | None, observed: float | None, name: str = "reward", value: float = 1.0
) -> NewReward:
    """A reward of tenant `local` naming a trajectory by its id, sent with an API key."""
    return NewReward(
        id=uuid.uuid4(),
        tenant="local",
        target_kind="trajectory",
        target=str(trajectory),
        target_trajectory_id=trajectory,
        target_call=None,
        name=name,
        value=value,
        metrics={},
        comment=None,
        group_id=None,
        idempotency_key=key,
        source="key",
        api_key_id=None,
        observed_at=observed,
    )
