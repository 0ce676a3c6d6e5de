"""Wire types of the reward API: what clients send and what they get back.

Numbers are strict: `reward` and metric values must be JSON numbers (not strings, not
booleans) and finite (`NaN`, `Infinity` and overflowing literals are refused).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from gateway.http.timestamps import Timestamp
from gateway.rewards.rules import DEFAULT_REWARD_NAME
from gateway.store.rewards import StoredReward, UnlinkedReward, UnlinkedRewards

NAME_PATTERN = r"^[A-Za-z0-9_.:\-/]{1,64}$"
MAX_METRICS = 64


def _finite_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a JSON number (strings and booleans are not accepted)")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError("must be a finite number") from None
    if not math.isfinite(number):
        raise ValueError("must be a finite number (NaN and infinities are not accepted)")
    return number


FiniteFloat = Annotated[float, BeforeValidator(_finite_number)]


class RewardIn(BaseModel):
    """One reward. Name its target with exactly one of `trajectory_id`, `client_trajectory_id`
    or `call_id`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "call_id": "chatcmpl-abc123",
                    "reward": 1.0,
                    "metrics": {"tests_passed": 12},
                    "idempotency_key": "ticket-4711-closed",
                }
            ]
        },
    )

    trajectory_id: str | None = Field(
        None,
        max_length=256,
        description=("The trajectory id the gateway returned (`X-Trajectory-Id` response header)."),
    )
    client_trajectory_id: str | None = Field(
        None,
        max_length=256,
        description=(
            "Your own trajectory id, as sent with the calls (`X-Trajectory-Id` request header or "
            "`metadata.trajectory_id`)."
        ),
    )
    call_id: str | None = Field(
        None,
        max_length=256,
        description=(
            "The `id` of a chat completion (`chatcmpl-...`) or the `X-Apprentice-Call-Id` header: "
            "the reward goes to that call's trajectory."
        ),
    )
    reward: FiniteFloat = Field(description="The reward: a finite JSON number within the policy's `reward_range`.")
    name: str = Field(
        DEFAULT_REWARD_NAME,
        pattern=NAME_PATTERN,
        description=(
            "What is rewarded. The learner trains on `reward`; a trajectory keeps one current reward per name."
        ),
    )
    metrics: dict[Annotated[str, Field(pattern=NAME_PATTERN)], FiniteFloat] | None = Field(
        None, max_length=MAX_METRICS, description="Extra named measurements (finite numbers), kept with the reward."
    )
    comment: str | None = Field(None, description="Free text, e.g. why this reward was given.")
    group_id: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description=("Says after the fact which trajectories were attempts at the same task (GRPO groups)."),
    )
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description=(
            "Your id for this reward. Sending the same key and content again changes nothing; new content "
            "under the same key replaces the earlier reward (history is kept). The `Idempotency-Key` header "
            "sets it too; given both, a single reward's must be equal (else 400)."
        ),
    )
    timestamp: Timestamp | None = Field(
        None,
        description=(
            "When the outcome was observed (unix seconds, or RFC 3339: UTC when no offset). Decides which reward is "
            "the latest when they arrive out of order; defaults to the time the gateway received it."
        ),
    )

    @model_validator(mode="after")
    def _one_target(self) -> RewardIn:
        given = [name for name in ("trajectory_id", "client_trajectory_id", "call_id") if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(
                "name exactly one target: trajectory_id, client_trajectory_id or call_id"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self


class RewardBatchIn(BaseModel):
    """Several rewards in one request: stored all together or not at all."""

    model_config = ConfigDict(extra="forbid")

    rewards: list[RewardIn] = Field(
        min_length=1, description="The rewards (at most `rewards.max_batch`, default 1000)."
    )


RewardStatus = Literal["pending", "linked", "rejected"]


class RewardOut(BaseModel):
    id: str = Field(description="The gateway's id of this reward row.")
    object: Literal["reward"] = "reward"
    status: RewardStatus = Field(
        description=(
            "`pending`: the trajectory is not stored yet (it links when it lands); `linked`; `rejected`: linked, "
            "but outside the rules of the trajectory's policy (see `reject_reason`)."
        )
    )
    current: bool = Field(description="True when this is the trajectory's reward of this name that counts.")
    trajectory_id: str | None = Field(description="The trajectory it is linked to (after merges), once linked.")
    target_kind: Literal["trajectory", "call"]
    target: str
    name: str
    reward: float
    metrics: dict[str, float]
    comment: str | None
    group_id: str | None
    idempotency_key: str | None
    observed_at: datetime
    received_at: datetime
    linked_at: datetime | None
    superseded_at: datetime | None
    reject_reason: str | None = None
    expires_at: datetime | None = Field(
        None, description="A pending reward is deleted at this time if its trajectory has not landed by then."
    )


class RewardListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[RewardOut]
    has_more: bool = False


class PendingRewardOut(RewardOut):
    overdue: bool = Field(description="Unknown for longer than `rewards.pending_window_s`.")


class PendingRewardListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[PendingRewardOut]
    pending_count: int = Field(description="All pending rewards visible to this key.")
    overdue_count: int = Field(description="Pending rewards older than the pending window.")
    rejected_count: int
    has_more: bool = False


# Answers from stored rewards. Each model is validated once, when it is built here.


def reward_out(reward: StoredReward, *, pending_expiry_s: float | None = None) -> RewardOut:
    fields = _reward_fields(reward)
    if reward.status == "pending" and pending_expiry_s is not None:
        fields["expires_at"] = reward.received_at + timedelta(seconds=pending_expiry_s)
    return RewardOut(**fields)


def pending_reward_list_out(page: UnlinkedRewards) -> PendingRewardListOut:
    return PendingRewardListOut(
        data=[_pending_reward_out(reward) for reward in page.rewards],
        pending_count=page.pending_count,
        overdue_count=page.overdue_count,
        rejected_count=page.rejected_count,
        has_more=page.has_more,
    )


def _pending_reward_out(reward: UnlinkedReward) -> PendingRewardOut:
    return PendingRewardOut(**_reward_fields(reward), overdue=reward.overdue)


def _reward_fields(reward: StoredReward) -> dict[str, Any]:
    """A stored reward's fields under their wire names."""
    return {
        "id": str(reward.id),
        "status": reward.status,
        "current": reward.current,
        "trajectory_id": str(reward.trajectory_id) if reward.trajectory_id else None,
        "target_kind": reward.target_kind,
        "target": reward.target,
        "name": reward.name,
        "reward": reward.value,
        "metrics": reward.metrics,
        "comment": reward.comment,
        "group_id": reward.group_id,
        "idempotency_key": reward.idempotency_key,
        "observed_at": reward.observed_at,
        "received_at": reward.received_at,
        "linked_at": reward.linked_at,
        "superseded_at": reward.superseded_at,
        "reject_reason": reward.reject_reason,
    }
