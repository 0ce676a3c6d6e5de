"""GET /v1/admin/policies/{policy}/teacher: the teacher, the distilled versions, the comparison.

Read-only; the document is apprentice.promotion.teacher_view's (docs/distillation.md).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from apprentice.promotion.policies import PolicyNotConfigured
from apprentice.promotion.teacher_view import NoTeacher, teacher_status
from gateway.endpoints.admin.routes import _admin
from gateway.http.documented import ADMIN, error_responses
from gateway.http.errors import GatewayError

router = APIRouter(tags=["admin"], dependencies=[ADMIN], responses=error_responses(401, 403, 404, 503))


class TeacherStatusOut(BaseModel):
    object: str = "policy.teacher"
    policy: str
    teacher: dict[str, Any] = Field(description="The teacher's settings, its prices and the policy's own.")
    status: str = Field(description="teacher_serves | canary (compared with the teacher) | taken_over.")
    promoted: str | None
    canary: str | None
    distilled_versions: list[dict[str, Any]] = Field(
        description="Versions made by distillation runs, oldest first, with what each trained on."
    )
    compared_version: str | None
    comparison: dict[str, Any] | None = Field(
        description="The latest comparison with the teacher: reward interval and verdict within the margin, "
        "cost and latency per call of each arm, the decision and its reason."
    )


@router.get(
    "/v1/admin/policies/{policy}/teacher",
    response_model=TeacherStatusOut,
    summary="A policy's teacher, its distilled versions and the comparison with the teacher",
)
async def get_teacher(request: Request, policy: str) -> TeacherStatusOut:
    state, _ = await _admin(request)
    try:
        document = await teacher_status(state.engine, state.settings, policy)
    except PolicyNotConfigured as exc:
        raise GatewayError(404, str(exc), param="policy", code="policy_not_found") from None
    except NoTeacher as exc:
        raise GatewayError(404, str(exc), param="policy", code="no_teacher") from None
    return TeacherStatusOut(**document)
