"""Wire types of the trajectory API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.endpoints.rewards.protocol import RewardOut, reward_out
from gateway.store.trajectories import CallRow, TrajectoryDetails, TrajectoryPage, TrajectoryRow


class CallOut(BaseModel):
    id: str = Field(description="The gateway's call id (`X-Apprentice-Call-Id`).")
    response_id: str | None = Field(description="The upstream answer's id (`chatcmpl-...`).")
    created_at: datetime
    model: str
    upstream: str | None
    upstream_model: str | None
    adapter_version_id: str | None
    status_code: int
    stream: bool
    latency_ms: float | None
    ttft_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    temperature: float | None
    request: dict[str, Any]
    response: dict[str, Any] | None
    error: Any | None = None


class TrajectorySummary(BaseModel):
    id: str
    object: Literal["trajectory"] = "trajectory"
    tenant: str
    model: str
    policy: str | None
    client_trajectory_id: str | None
    group_id: str | None
    adapter_version_id: str | None = Field(description="The adapter version that served the first call.")
    first_call_at: datetime
    last_call_at: datetime
    call_count: int
    trained_in_run_id: str | None
    trainable: bool = Field(
        description="False when its key or its policy opted out of training: recorded, never trained on or judged."
    )
    reward: float | None = Field(description="The current reward named `reward`, if any.")
    reward_count: int = Field(description="Current rewards (one per name).")


class TrajectoryOut(TrajectorySummary):
    aliases: list[str] = Field(description="Ids of trajectories merged into this one (still valid to address it).")
    group_trajectory_ids: list[str] = Field(description="Other trajectories of the same group (at most 100).")
    adapter_version_ids: list[str] = Field(description="Every adapter version that served one of its calls.")
    calls: list[CallOut]
    rewards: list[RewardOut] = Field(description="Current rewards; with `history=true` every stored one.")


class TrajectoryListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[TrajectorySummary]
    has_more: bool
    next_starting_after: str | None = Field(description="Pass as `starting_after` for the next page.")


# Answers from stored trajectories. Each model is validated once, when it is built here.


def trajectory_out(details: TrajectoryDetails) -> TrajectoryOut:
    return TrajectoryOut(
        **_summary_fields(details.trajectory),
        aliases=[str(alias) for alias in details.aliases],
        group_trajectory_ids=[str(member) for member in details.group_members],
        adapter_version_ids=[str(version) for version in details.adapter_version_ids],
        calls=[_call_out(call) for call in details.calls],
        rewards=[reward_out(reward) for reward in details.rewards],
    )


def trajectory_list_out(page: TrajectoryPage) -> TrajectoryListOut:
    data = [TrajectorySummary(**_summary_fields(row)) for row in page.trajectories]
    return TrajectoryListOut(
        data=data, has_more=page.has_more, next_starting_after=data[-1].id if page.has_more and data else None
    )


def _summary_fields(row: TrajectoryRow) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "tenant": row.tenant,
        "model": row.model,
        "policy": row.policy,
        "client_trajectory_id": row.client_trajectory_id,
        "group_id": row.group_id,
        "adapter_version_id": _text(row.adapter_version_id),
        "first_call_at": row.first_call_at,
        "last_call_at": row.last_call_at,
        "call_count": row.call_count,
        "trained_in_run_id": _text(row.trained_in_run_id),
        "trainable": row.trainable,
        "reward": row.reward,
        "reward_count": row.reward_count,
    }


def _call_out(call: CallRow) -> CallOut:
    return CallOut(
        id=str(call.id),
        response_id=call.response_id,
        created_at=call.created_at,
        model=call.model,
        upstream=call.upstream,
        upstream_model=call.upstream_model,
        adapter_version_id=_text(call.adapter_version_id),
        status_code=call.status_code,
        stream=call.stream,
        latency_ms=call.latency_ms,
        ttft_ms=call.ttft_ms,
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        temperature=call.temperature,
        request=call.request,
        response=call.response,
        error=call.error,
    )


def _text(value: uuid.UUID | None) -> str | None:
    return str(value) if value is not None else None


class TrainedVersionOut(BaseModel):
    name: str
    policy: str
    status: str
    direct: bool = Field(description="Trained on the trajectory itself (false: trained from such a version since).")


class TrajectoryDeletedOut(BaseModel):
    id: str
    object: Literal["trajectory.deleted"] = "trajectory.deleted"
    deleted: bool = True
    aliases: list[str] = Field(description="Ids of trajectories merged into it, deleted with it.")
    calls: int
    rewards: int
    trained_into: list[TrainedVersionOut] = Field(
        description="Adapter versions already trained on it (their weights are not retrained)."
    )
