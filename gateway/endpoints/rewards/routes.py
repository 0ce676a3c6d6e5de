"""POST /v1/rewards (one reward or a batch), GET /v1/rewards/pending (admin report) and GET /v1/rewards/{id}."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import TypeAdapter
from starlette.datastructures import State

from gateway.endpoints.rewards.intake import (
    IDEMPOTENCY_HEADER,
    MAX_IDEMPOTENCY_HEADER_CHARS,
    Intake,
    Sender,
    idempotency_header,
    new_reward,
    parse_rewards,
    policy_check,
    refuse_large_batch,
)
from gateway.endpoints.rewards.protocol import (
    PendingRewardListOut,
    RewardBatchIn,
    RewardIn,
    RewardListOut,
    RewardOut,
    pending_reward_list_out,
    reward_out,
)
from gateway.http.asgi import Scope, header
from gateway.http.documented import ADMIN, CLIENT, error_responses
from gateway.http.errors import GatewayError
from gateway.http.responses import model_response
from gateway.rewards.group_commit import GroupCommitter
from gateway.rewards.rules import RewardRules
from gateway.rewards.signatures import SIGNATURE_HEADER, SignatureVerifier
from gateway.state import GatewayState
from gateway.store.rewards import (
    Ingested,
    IntakeRequest,
    ReplayedSignature,
    TooManyPending,
    ingest_group,
    list_unlinked,
    store_unavailable,
)
from gateway.store.rewards import get_reward as load

log = logging.getLogger(__name__)
router = APIRouter(tags=["rewards"], responses=error_responses(401, 503))

REPLAYED_HEADER = "Idempotent-Replayed"
SIGNATURE_HEADER_RAW = SIGNATURE_HEADER.lower().encode()
IDEMPOTENCY_HEADER_RAW = IDEMPOTENCY_HEADER.lower().encode()
# What a sender should wait before retrying when PostgreSQL is unreachable.
RETRY_AFTER_S = 1
_REQUEST = TypeAdapter(RewardIn | RewardBatchIn)


def inline_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema with its local `$defs` references inlined (for openapi_extra)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(dict(defs[ref.split("/")[-1]]))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result


_REQUEST_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": inline_schema(_REQUEST.json_schema())}},
    }
}

_RESPONSE_SCHEMA = inline_schema(TypeAdapter(RewardOut | RewardListOut).json_schema(mode="serialization"))

_SIGNATURE_DOC = {
    "parameters": [
        {
            "name": SIGNATURE_HEADER,
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "Signed webhooks instead of a bearer key: `t=<unix>,v1=<hex HMAC-SHA256(secret, "
            '"<t>." + body)>`.',
        },
        {
            "name": IDEMPOTENCY_HEADER,
            "in": "header",
            "required": False,
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_HEADER_CHARS, "pattern": r"\S"},
            "description": "Sets `idempotency_key` (for a batch, item i without its own key gets `<key>:<i>`). "
            "A single reward whose body also gives `idempotency_key` must give the same value: a different one "
            "is refused with 400 (`param`: `idempotency_key`, `code`: `invalid_value`).",
        },
    ]
}


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


@router.post(
    "/v1/rewards",
    summary="Record one reward or a batch",
    description=(
        "Takes a reward for a trajectory named by the gateway's trajectory id, the client's own trajectory "
        "id, or a call id (`chatcmpl-...`). Authenticate with the API key that made the calls, or sign the "
        f'request (`{SIGNATURE_HEADER}`). A batch (`{{"rewards": [...]}}`) is stored all together or not at '
        "all: the first invalid item refuses the request with 400 and `param` naming it (`rewards[3].reward`). "
        "A reward whose trajectory is not stored yet is accepted with status `pending` and linked when it "
        'lands. Answers the stored reward (or `{"object": "list", "data": [...]}` for a batch); a request '
        f"whose every item was already stored under its idempotency key answers `{REPLAYED_HEADER}: true`."
    ),
    responses={
        200: {
            "description": "The stored rewards, in request order.",
            "content": {"application/json": {"schema": _RESPONSE_SCHEMA}},
        },
        400: {
            "description": "Invalid input; `error.param` names the field. Among them: a single reward whose "
            f"`idempotency_key` differs from the `{IDEMPOTENCY_HEADER}` header (`param`: `idempotency_key`), a "
            "string holding NUL (`\\u0000`), a reward its policy's rules refuse."
        },
        401: {"description": "Missing or invalid API key or signature, or a stale signature."},
        409: {"description": "A signature that was already used (replay)."},
        429: {"description": "The tenant holds `rewards.max_pending_per_tenant` pending rewards already."},
        413: {"description": "More rewards than `rewards.max_batch`, or a body over the size limit."},
        503: {"description": "PostgreSQL is unreachable: nothing was stored; retry after `Retry-After` seconds."},
    },
    openapi_extra={**_REQUEST_SCHEMA, **_SIGNATURE_DOC},
    dependencies=[CLIENT],
)
async def post_rewards(request: Request) -> Response:
    # Served by gateway/endpoints/rewards/handler.py before FastAPI; declared here for the
    # OpenAPI document, and answering the same should a request reach it.
    return await answer_post(_state(request), request.app.state, dict(request.scope), await request.body())


async def answer_post(state: GatewayState, holder: State, scope: Scope, body: bytes) -> Response:
    """POST /v1/rewards: the answer to one request (raises GatewayError for a refusal). `holder`
    keeps what is built on first use (rules, signature verifier, group committer)."""
    sender = await _sender(scope, state, holder, body)
    rewards, batch = parse_rewards(body)
    refuse_large_batch(len(rewards), state.settings.rewards.max_batch)
    intake = Intake(
        sender=sender,
        batch=batch,
        header_key=idempotency_header(header(scope, IDEMPOTENCY_HEADER_RAW)),
        max_comment_chars=state.settings.rewards.max_comment_chars,
        instance_secret=state.instance_secret,
    )
    items = [new_reward(reward, index, intake) for index, reward in enumerate(rewards)]
    ingest = IntakeRequest(items, policy_check(_rules(state, holder), rewards, intake), sender.signature)
    try:
        ingested = await _ingest(state, holder, ingest)
    except StoreUnavailable as error:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return Response(error.body(), status_code=503, media_type="application/json", headers=headers)
    stored, replayed = ingested.stored, ingested.replayed
    if any(reward.status == "pending" for reward in stored):
        state.reward_linker.wake()
    if state.tracer is not None and not replayed:  # a replay's spans went out the first time
        state.tracer.offer_rewards(items, stored)
    expiry_s = state.settings.rewards.pending_expiry_s
    answers = [reward_out(reward, pending_expiry_s=expiry_s) for reward in stored]
    answer = RewardListOut(data=answers) if batch else answers[0]
    return model_response(answer, headers={REPLAYED_HEADER: "true"} if replayed else None)


async def _sender(scope: Scope, state: GatewayState, holder: State, body: bytes) -> Sender:
    """A signed webhook when the request carries a signature, else the API key's holder."""
    signature_header = header(scope, SIGNATURE_HEADER_RAW)
    if signature_header is not None:
        verified = _verifier(state, holder).verify(signature_header, body)
        return Sender(
            tenant=verified.tenant,
            source=f"webhook:{verified.secret_name}",
            api_key_id=None,
            signature=(verified.signature, verified.tenant, verified.signed_at),
        )
    key = await state.authenticate(scope)
    return Sender(tenant=key.tenant, source="key", api_key_id=key.id, signature=None)


async def _ingest(state: GatewayState, holder: State, ingest: IntakeRequest) -> Ingested:
    """A single reward joins the process's group commit; a batch is its own transaction."""
    max_pending = state.settings.rewards.max_pending_per_tenant
    try:
        if len(ingest.rewards) == 1:
            return await _committer(state, holder).submit(ingest)
        [outcome] = await ingest_group(state.engine, [ingest], max_pending=max_pending)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    except TooManyPending as exc:
        raise GatewayError(429, str(exc), code="too_many_pending_rewards") from None
    except ReplayedSignature:
        raise GatewayError(
            409,
            "this signature was already used: sign each delivery anew",
            param=SIGNATURE_HEADER,
            code="signature_replayed",
        ) from None
    except Exception as exc:
        if store_unavailable(exc):
            log.warning("rewards not stored, PostgreSQL unavailable: %r", exc)
            raise StoreUnavailable() from exc
        raise


class StoreUnavailable(GatewayError):
    """PostgreSQL could not be reached: nothing was confirmed stored; the sender retries."""

    def __init__(self) -> None:
        super().__init__(
            503,
            "the reward store (PostgreSQL) is unavailable; the reward was not stored, retry later "
            "(with an idempotency_key a retry is never stored twice)",
            code="store_unavailable",
        )


def _committer(state: GatewayState, holder: State) -> GroupCommitter:
    """Built on first use, one per process (it holds no task between requests)."""
    committer: GroupCommitter | None = getattr(holder, "reward_committer", None)
    if committer is None:
        committer = GroupCommitter(state.engine, max_pending=state.settings.rewards.max_pending_per_tenant)
        holder.reward_committer = committer
    return committer


def _verifier(state: GatewayState, holder: State) -> SignatureVerifier:
    """Built on first use: a webhook secret that cannot be resolved fails the signed requests only."""
    verifier: SignatureVerifier | None = getattr(holder, "reward_signatures", None)
    if verifier is None:
        settings = state.settings.rewards
        verifier = SignatureVerifier(settings.webhook_secrets, settings.tolerance_s)
        holder.reward_signatures = verifier
    return verifier


def _rules(state: GatewayState, holder: State) -> RewardRules:
    rules: RewardRules | None = getattr(holder, "reward_rules", None)
    if rules is None:
        rules = holder.reward_rules = RewardRules(state.settings)
    return rules


@router.get(
    "/v1/rewards/pending",
    response_model=PendingRewardListOut,
    summary="Rewards not linked to a trajectory (admin)",
    description=(
        "Rewards still waiting for their trajectory (`overdue` once older than "
        "`rewards.pending_window_s`) and rewards refused by their trajectory's policy when they linked "
        "(`rejected`). Nothing is dropped: a pending reward links whenever its trajectory lands."
    ),
    dependencies=[ADMIN],
    responses=error_responses(403),
)
async def pending_rewards(
    request: Request,
    status: str = Query("pending", pattern="^(pending|rejected|all)$", description="`pending`, `rejected` or `all`."),
    overdue_only: bool = Query(False, description="Only pending rewards past the pending window."),
    tenant: str | None = Query(None, description="Only this tenant's rewards."),
    limit: int = Query(100, ge=1, le=1000),
) -> Response:
    state = _state(request)
    await state.authenticate(request.scope, admin=True)
    statuses = ["pending", "rejected"] if status == "all" else [status]
    page = await list_unlinked(
        state.engine,
        tenant=tenant,
        window_s=state.settings.rewards.pending_window_s,
        statuses=statuses,
        overdue_only=overdue_only,
        limit=limit,
    )
    return model_response(pending_reward_list_out(page))


@router.get(
    "/v1/rewards/{reward_id}",
    response_model=RewardOut,
    summary="One stored reward",
    description="A reward by the id the gateway answered; a client key sees its own tenant's only.",
    dependencies=[CLIENT],
    responses=error_responses(404, s404="No such reward for this key."),
)
async def get_reward(request: Request, reward_id: str) -> Response:
    state = _state(request)
    key = await state.authenticate(request.scope)
    try:
        parsed = uuid.UUID(reward_id)
    except ValueError:
        raise GatewayError(404, f"no reward {reward_id!r}", param="reward_id", code="not_found") from None
    reward = await load(state.engine, parsed, None if key.is_admin else key.tenant)
    if reward is None:
        raise GatewayError(404, f"no reward {reward_id!r}", param="reward_id", code="not_found")
    return model_response(reward_out(reward, pending_expiry_s=state.settings.rewards.pending_expiry_s))
