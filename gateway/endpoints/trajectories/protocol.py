"""Wire types of the trajectory API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.endpoints.rewards.protocol import RewardOut


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
