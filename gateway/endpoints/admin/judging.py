"""GET /v1/admin/policies/{policy}/judge: the judge's configuration, budget and outcomes.

The budget figures are read from PostgreSQL (the judgements of the last hour, every gateway
process's), so any process answers the same; `exhausted: true` means judging waits until
`resumes_at`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from gateway.endpoints.admin.routes import _admin
from gateway.http.documented import ADMIN, error_responses
from gateway.http.errors import GatewayError
from gateway.judging import store
from gateway.judging.rubric import rubric_hash, rubric_text

router = APIRouter(tags=["admin"], dependencies=[ADMIN], responses=error_responses(401, 403, 404, 503))


class JudgeConfigOut(BaseModel):
    model: str
    mode: str
    reward_name: str
    rubric_hash: str
    rubric_is_default: bool
    max_group_size: int
    concurrency: int
    max_attempts: int


class JudgeBudgetOut(BaseModel):
    window_s: float
    calls_used: int
    calls_per_hour: int | None
    tokens_used: int
    tokens_per_hour: int | None
    running: int
    exhausted: bool = Field(description="Judging waits for the budget until resumes_at.")
    resumes_at: datetime | None


class JudgeFailureOut(BaseModel):
    id: str
    tenant: str
    group_key: str
    chunk: int
    judge_model: str
    rubric_hash: str
    reason: str | None
    attempts: int
    finished_at: datetime | None


class JudgeStatusOut(BaseModel):
    object: str = "policy.judge"
    policy: str
    reward_source: str = Field(description="What the learner trains on: webhook, judge or webhook_else_judge.")
    judge: JudgeConfigOut | None
    budget: JudgeBudgetOut | None
    judgements: dict[str, int] = Field(description="Judgements by status: running, judged, failed.")
    recent_failures: list[JudgeFailureOut]


@router.get(
    "/v1/admin/policies/{policy}/judge",
    response_model=JudgeStatusOut,
    summary="The policy's LLM judge: configuration, hourly budget, outcomes",
)
async def judge_status(request: Request, policy: str) -> JudgeStatusOut:
    state, _ = await _admin(request)
    settings = state.settings.policy(policy)
    if settings is None:
        raise GatewayError(404, f"no policy {policy!r} is configured", param="policy", code="policy_not_found")
    counts, failures = await store.status_counts(state.engine, policy)
    config = budget = None
    if settings.judge is not None:
        judge = settings.judge
        config = JudgeConfigOut(
            model=judge.model,
            mode=judge.mode,
            reward_name=judge.reward_name,
            rubric_hash=rubric_hash(rubric_text(judge)),
            rubric_is_default=not (judge.rubric and judge.rubric.strip()),
            max_group_size=judge.max_group_size,
            concurrency=judge.concurrency,
            max_attempts=judge.max_attempts,
        )
        use = await store.usage(state.engine, policy, judge)
        budget = JudgeBudgetOut(
            window_s=store.BUDGET_WINDOW_S,
            calls_used=use.calls,
            calls_per_hour=use.calls_limit,
            tokens_used=use.tokens,
            tokens_per_hour=use.tokens_limit,
            running=use.running,
            exhausted=use.exhausted,
            resumes_at=datetime.fromtimestamp(use.resumes_at, timezone.utc)
            if use.exhausted and use.resumes_at
            else None,
        )
    return JudgeStatusOut(
        policy=policy,
        reward_source=settings.reward_source,
        judge=config,
        budget=budget,
        judgements=counts,
        recent_failures=[JudgeFailureOut(**{**f, "id": str(f["id"])}) for f in failures],
    )
