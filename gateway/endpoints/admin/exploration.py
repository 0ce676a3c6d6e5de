"""GET /v1/admin/policies/{policy}/exploration: exploration's settings and what it spent.

`recorded_last_hour` and `recorded_last_day` are read from PostgreSQL (every gateway process's
unserved answers that reached the store); `this_process` is the answering process's own view:
its budget's last hour (reserved and generated: the budget is per process) and its outcomes
since it started (docs/exploration.md).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from gateway.endpoints.admin.routes import _admin
from gateway.http.documented import ADMIN, error_responses
from gateway.http.errors import GatewayError
from gateway.store.exploration import exploration_spend

router = APIRouter(tags=["admin"], dependencies=[ADMIN], responses=error_responses(401, 403, 404, 503))

HOUR_S = 3600.0
DAY_S = 86400.0


class ExplorationOut(BaseModel):
    object: str = "policy.exploration"
    policy: str
    enabled: bool
    settings: dict[str, Any] = Field(description="The policy's learning.exploration settings.")
    recorded_last_hour: dict[str, Any] = Field(
        description="Unserved answers recorded in the last hour, the calls they explored and their tokens."
    )
    recorded_last_day: dict[str, Any]
    this_process: dict[str, Any] | None = Field(
        description="This gateway process's budget used in the last hour and its outcomes since start."
    )


@router.get(
    "/v1/admin/policies/{policy}/exploration",
    response_model=ExplorationOut,
    summary="A policy's exploration samples: settings, budget and spend",
)
async def get_exploration(request: Request, policy: str) -> ExplorationOut:
    state, _ = await _admin(request)
    configured = next((p for p in state.settings.policies if p.name == policy), None)
    if configured is None:
        raise GatewayError(404, f"no policy named {policy!r} is configured", param="policy", code="policy_not_found")
    settings = configured.learning.exploration
    hour = await exploration_spend(state.engine, policy, HOUR_S)
    day = await exploration_spend(state.engine, policy, DAY_S)
    return ExplorationOut(
        policy=policy,
        enabled=settings.enabled,
        settings=settings.model_dump(),
        recorded_last_hour=asdict(hour),
        recorded_last_day=asdict(day),
        this_process=state.explorer.report().get(policy),
    )
