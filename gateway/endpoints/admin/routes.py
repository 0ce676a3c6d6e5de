"""/v1/admin/...: adapter promotion for operators (admin key). See docs/operations-promotion.md.

Every action is idempotent: asking for the status a version already has answers 200 with
`changed: false`. A transition that the version's status does not allow answers 409 naming
the status; an adapter that an endpoint would not load answers 502 naming the endpoint.

Also a policy's judge agreement: how well its LLM judge ranks groups the way the webhook
rewards do (gateway/judging/agreement.py), read-only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from fastapi import APIRouter, Query, Request

from apprentice.promotion import actions, listing, policies
from apprentice.promotion.lifecycle import TransitionError, VersionNotFound
from apprentice.promotion.loading import LoadError
from apprentice.promotion.status import VersionStatus
from gateway.endpoints.admin.protocol import (
    ActionIn,
    ActionOut,
    JudgeAgreementOut,
    PolicyListOut,
    PolicyOut,
    PolicyStateOut,
    PromoteIn,
    RollbackIn,
    VersionDetailOut,
    VersionListOut,
)
from gateway.http.documented import ADMIN, error_responses
from gateway.http.errors import GatewayError
from gateway.http.timestamps import QueryTimestamp, timestamp_schema
from gateway.judging.agreement import Bucket
from gateway.judging.agreement_store import judge_reward_name, policy_agreement
from gateway.state import GatewayState

router = APIRouter(tags=["admin"], dependencies=[ADMIN], responses=error_responses(401, 403, 404, 503))
# What a transition can also answer (see `_guard`).
TRANSITION_ERRORS = error_responses(
    409,
    502,
    s409="The version's status does not allow this transition.",
    s502="An endpoint would not load the adapter.",
)

T = TypeVar("T")


async def _guard(call: Callable[[], Awaitable[T]]) -> T:
    """Run a promotion call, turning its errors into OpenAI-format gateway errors."""
    try:
        return await call()
    except VersionNotFound as exc:
        raise GatewayError(404, str(exc), param="version", code="version_not_found") from None
    except policies.PolicyNotConfigured as exc:
        raise GatewayError(404, str(exc), param="policy", code="policy_not_found") from None
    except TransitionError as exc:
        raise GatewayError(409, str(exc), code="illegal_transition") from None
    except LoadError as exc:
        raise GatewayError(502, str(exc), code="adapter_load_failed") from None


async def _admin(request: Request) -> tuple[GatewayState, str]:
    state: GatewayState = request.app.state.gateway
    key = await state.authenticate(request.scope, admin=True)
    return state, key.name


@router.get(
    "/v1/admin/policies",
    response_model=PolicyListOut,
    summary="Policies with their serving versions",
    description="Every configured policy: its promoted and canary versions, the live lineage and its head, "
    "promotion settings and whether learning is paused.",
)
async def list_policies(request: Request) -> PolicyListOut:
    state, _ = await _admin(request)
    summaries = await listing.list_policies(state.engine, state.settings)
    return PolicyListOut(data=[PolicyOut.of(summary) for summary in summaries])


@router.get("/v1/admin/policies/{policy}", response_model=PolicyOut, summary="One policy")
async def get_policy(request: Request, policy: str) -> PolicyOut:
    state, _ = await _admin(request)
    for summary in await listing.list_policies(state.engine, state.settings):
        if summary.policy.name == policy:
            return PolicyOut.of(summary)
    raise GatewayError(404, f"policy {policy!r} is not configured", param="policy", code="policy_not_found")


@router.get(
    "/v1/admin/policies/{policy}/versions",
    response_model=VersionListOut,
    summary="A policy's adapter versions, newest first",
    description="Each with its parent, whether it is in the live lineage (and which version heads it), its "
    "training run's sample count and the versions that sampled what it trained on.",
)
async def list_versions(
    request: Request,
    policy: str,
    status: VersionStatus | None = Query(None),
    kind: Literal["rl", "sft"] | None = Query(
        None, description="Only versions whose training run was of this kind: rl (GRPO) or sft (distillation)."
    ),
) -> VersionListOut:
    state, _ = await _admin(request)
    page = await _guard(lambda: listing.version_listing(state.engine, state.settings, policy, status))
    if kind is not None:
        shown = [v for v in page.versions if page.provenance[v.id].kind == kind]
        page = dataclasses.replace(page, versions=shown)
    return VersionListOut.of(page)


@router.get(
    "/v1/admin/versions/{version}",
    response_model=VersionDetailOut,
    summary="One adapter version: training run, gates, canary statistics, transitions",
    description="`version` is the id or the LoRA name. For a canary, `evaluation` is computed now: "
    "both arms' reward statistics, the interval on the difference, the verdict and what an "
    "automatic policy would do.",
)
async def get_version(request: Request, version: str) -> VersionDetailOut:
    state, _ = await _admin(request)
    return VersionDetailOut.of(await _guard(lambda: listing.version_detail(state.engine, state.settings, version)))


@router.post(
    "/v1/admin/versions/{version}/approve",
    response_model=ActionOut,
    responses=TRANSITION_ERRORS,
    summary="Approve a version",
    description="A candidate becomes the canary (its gates must pass); a canary is promoted. The adapter "
    "is loaded and verified at every endpoint of the policy before the status changes.",
)
async def approve(request: Request, version: str, body: ActionIn | None = None) -> ActionOut:
    state, actor = await _admin(request)
    reason = body.reason if body else None
    return ActionOut.of(
        await _guard(lambda: actions.approve(state.engine, state.settings, version, actor=actor, reason=reason))
    )


@router.post(
    "/v1/admin/versions/{version}/reject",
    response_model=ActionOut,
    responses=TRANSITION_ERRORS,
    summary="Reject a version",
    description="A candidate is rejected; rejecting the canary rejects its whole lineage (the learner "
    "starts again from the promoted version). A canary stops receiving new trajectories within "
    "a poll interval (running trajectories finish on it).",
)
async def reject(request: Request, version: str, body: ActionIn | None = None) -> ActionOut:
    state, actor = await _admin(request)
    reason = body.reason if body else None
    return ActionOut.of(
        await _guard(lambda: actions.reject(state.engine, state.settings, version, actor=actor, reason=reason))
    )


@router.post(
    "/v1/admin/versions/{version}/promote",
    response_model=ActionOut,
    responses=TRANSITION_ERRORS,
    summary="Promote now",
    description="Promote a candidate, canary or retired version at once; the promoted one is retired. "
    "A candidate must pass its gates unless `force` is true.",
)
async def promote(request: Request, version: str, body: PromoteIn | None = None) -> ActionOut:
    state, actor = await _admin(request)
    reason, force = (body.reason, body.force) if body else (None, False)
    return ActionOut.of(
        await _guard(
            lambda: actions.promote_now(state.engine, state.settings, version, actor=actor, reason=reason, force=force)
        )
    )


@router.post(
    "/v1/admin/policies/{policy}/rollback",
    response_model=ActionOut,
    responses=TRANSITION_ERRORS,
    summary="Roll back to a version",
    description="Promote a retired version of the policy again (loaded first; refused if its files "
    "were deleted). The promoted version is retired and stays loaded for the grace period.",
)
async def rollback(request: Request, policy: str, body: RollbackIn) -> ActionOut:
    state, actor = await _admin(request)
    ref = body.version_id if body.version_id is not None else str(body.version)
    return ActionOut.of(
        await _guard(
            lambda: actions.rollback(state.engine, state.settings, policy, ref, actor=actor, reason=body.reason)
        )
    )


async def _pause(request: Request, policy: str, paused: bool) -> PolicyStateOut:
    state, actor = await _admin(request)
    row = await _guard(lambda: actions.set_paused(state.engine, state.settings, policy, paused, actor=actor))
    return PolicyStateOut.model_validate(row)


@router.post(
    "/v1/admin/policies/{policy}/pause",
    response_model=PolicyStateOut,
    summary="Pause learning",
    description="No training runs, automatic canary starts or promotions for the policy until resumed; "
    "a significantly worse lineage is still rejected. Serving is unchanged.",
)
async def pause(request: Request, policy: str) -> PolicyStateOut:
    return await _pause(request, policy, True)


@router.post("/v1/admin/policies/{policy}/resume", response_model=PolicyStateOut, summary="Resume learning")
async def resume(request: Request, policy: str) -> PolicyStateOut:
    return await _pause(request, policy, False)


@router.get(
    "/v1/admin/policies/{policy}/judge/agreement",
    response_model=JudgeAgreementOut,
    summary="How well the judge agrees with the webhook rewards",
    description="Over the trajectories that have both a current webhook reward and a current judge score: "
    "per judged group, Spearman's rho and the pairwise accuracy of the judge against the webhook rewards, "
    "then their mean and pooled values with 95% bootstrap intervals (resampling groups), overall and per "
    "hour or day of judging, and the judge models and rubric hashes that contributed. A policy without a "
    "judge configured answers the judge scores it has (e.g. from the CLI) under the default name `judge`.",
)
async def judge_agreement(
    request: Request,
    policy: str,
    bucket: Bucket = Query("day", description="Split the figures per `hour` or `day` (UTC) of judging."),
    since: QueryTimestamp | None = Query(
        None,
        description="Only groups judged at or after this time (RFC 3339, UTC when no offset, or unix seconds).",
        json_schema_extra=timestamp_schema,
    ),
    rubric_hash: str | None = Query(None, description="Only judgements with this rubric hash."),
) -> JudgeAgreementOut:
    state, _ = await _admin(request)
    settings = state.settings.policy(policy)
    if settings is None:
        raise GatewayError(404, f"policy {policy!r} is not configured", param="policy", code="policy_not_found")
    report = await policy_agreement(state.engine, settings, bucket=bucket, since=since, rubric_hash=rubric_hash)
    judge_name = judge_reward_name(settings)
    return JudgeAgreementOut.of(
        report,
        policy=policy,
        webhook_reward=settings.learning.reward_name,
        judge_reward=judge_name,
        bucket=bucket,
        since=since,
        rubric_hash=rubric_hash,
    )
