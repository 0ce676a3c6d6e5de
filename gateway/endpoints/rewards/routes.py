"""POST /v1/rewards (one reward or a batch) and GET /v1/rewards/pending (admin report)."""

from __future__ import annotations

import inspect
import json
import uuid
from datetime import timezone
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request, Response
from pydantic import TypeAdapter, ValidationError

from gateway.endpoints.rewards.protocol import (
    PendingRewardListOut,
    RewardBatchIn,
    RewardIn,
    RewardListOut,
    RewardOut,
)
from gateway.rewards.rules import RewardRules
from gateway.rewards.signatures import SIGNATURE_HEADER, SignatureVerifier
from gateway.http.errors import GatewayError
from gateway.state import GatewayState
from gateway.store.rewards import ReplayedSignature, content_hash, ingest_rewards, list_unlinked
from gateway.store.rewards import get_reward as load
from gateway.trajectories import stitching

router = APIRouter(tags=["rewards"])

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
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

    return walk(schema)


_REQUEST_SCHEMA = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": inline_schema(_REQUEST.json_schema())}}}}

_RESPONSE_SCHEMA = inline_schema(TypeAdapter(RewardOut | RewardListOut).json_schema(mode="serialization"))

_SIGNATURE_DOC = {"parameters": [
    {"name": SIGNATURE_HEADER, "in": "header", "required": False, "schema": {"type": "string"},
     "description": "Signed webhooks instead of a bearer key: `t=<unix>,v1=<hex HMAC-SHA256(secret, "
                    "\"<t>.\" + body)>`."},
    {"name": IDEMPOTENCY_HEADER, "in": "header", "required": False, "schema": {"type": "string"},
     "description": "Sets `idempotency_key` (for a batch, item i without its own key gets `<key>:<i>`)."}]}


def _state(request: Request) -> GatewayState:
    return request.app.state.gateway


def _verifier(request: Request) -> SignatureVerifier:
    verifier = getattr(request.app.state, "reward_signatures", None)
    if verifier is None:
        settings = _state(request).settings.rewards
        verifier = SignatureVerifier(settings.webhook_secrets, settings.tolerance_s)
        request.app.state.reward_signatures = verifier
    return verifier


def _rules(request: Request) -> RewardRules:
    rules = getattr(request.app.state, "reward_rules", None)
    if rules is None:
        rules = request.app.state.reward_rules = RewardRules(_state(request).settings)
    return rules


_CLIENT_ID_TAKES_SECRET = len(inspect.signature(stitching.trajectory_id_for_client).parameters) == 3


def client_trajectory_uuid(state: GatewayState, tenant: str, client_id: str) -> uuid.UUID:
    """The gateway id of a client's own trajectory id, exactly as the chat path derives it."""
    if _CLIENT_ID_TAKES_SECRET:
        return stitching.trajectory_id_for_client(getattr(state, "instance_secret", b""), tenant, client_id)
    return stitching.trajectory_id_for_client(tenant, client_id)  # type: ignore[call-arg]


def _param(loc: tuple[Any, ...]) -> str | None:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in ("function-after[_one_target()]",):
            continue
        else:
            text += ("." if text else "") + str(part)
    return text or None


def _validation_error(error: ValidationError, batch: bool) -> GatewayError:
    first = error.errors()[0]
    loc = tuple(first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    param = _param(loc)
    if "exactly one target" in message:
        param = (param + "." if param else "") + "trajectory_id"
    if not batch and param and param.startswith("rewards"):
        param = None
    return GatewayError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


def _parse(body: bytes) -> tuple[list[RewardIn], bool]:
    try:
        data = json.loads(body)  # accepts NaN/Infinity literals so that the field can be named
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise GatewayError(400, "the body must be a JSON object: one reward, or {\"rewards\": [...]}",
                           code="invalid_json")
    batch = "rewards" in data
    try:
        if batch:
            return RewardBatchIn.model_validate(data).rewards, True
        return [RewardIn.model_validate(data)], False
    except ValidationError as error:
        raise _validation_error(error, batch) from None


def _field(batch: bool, index: int, name: str) -> str:
    return f"rewards[{index}].{name}" if batch else name


@router.post(
    "/v1/rewards",
    summary="Record one reward or a batch",
    description=(
        "Takes a reward for a trajectory named by the gateway's trajectory id, the client's own trajectory "
        "id, or a call id (`chatcmpl-...`). Authenticate with the API key that made the calls, or sign the "
        f"request (`{SIGNATURE_HEADER}`). A batch (`{{\"rewards\": [...]}}`) is stored all together or not at "
        "all: the first invalid item refuses the request with 400 and `param` naming it (`rewards[3].reward`). "
        "A reward whose trajectory is not stored yet is accepted with status `pending` and linked when it "
        "lands. Answers the stored reward (or `{\"object\": \"list\", \"data\": [...]}` for a batch); a request "
        f"whose every item was already stored under its idempotency key answers `{REPLAYED_HEADER}: true`."),
    responses={200: {"description": "The stored rewards, in request order.",
                     "content": {"application/json": {"schema": _RESPONSE_SCHEMA}}},
               400: {"description": "Invalid input; `error.param` names the field."},
               401: {"description": "Missing or invalid API key or signature, or a stale signature."},
               409: {"description": "A signature that was already used (replay)."},
               413: {"description": "More rewards than `rewards.max_batch`, or a body over the size limit."}},
    openapi_extra={**_REQUEST_SCHEMA, **_SIGNATURE_DOC},
)
async def post_rewards(request: Request) -> Response:
    state = _state(request)
    settings = state.settings.rewards
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > state.settings.limits.max_body_bytes:
        raise GatewayError(413, f"the body is larger than {state.settings.limits.max_body_bytes} bytes",
                           code="body_too_large")
    signature_header = request.headers.get(SIGNATURE_HEADER)
    body = await request.body()
    signature: tuple[bytes, str, float] | None = None
    if signature_header is not None:
        verified = _verifier(request).verify(signature_header, body)
        tenant, source, api_key_id = verified.tenant, f"webhook:{verified.secret_name}", None
        signature = (verified.signature, verified.tenant, verified.signed_at)
    else:
        key = await state.authenticate(request.scope)
        tenant, source, api_key_id = key.tenant, "key", key.id
    rewards, batch = _parse(body)
    if len(rewards) > settings.max_batch:
        raise GatewayError(413, f"rewards: {len(rewards)} rewards in one request; at most {settings.max_batch}",
                           param="rewards", code="batch_too_large")
    header_key = request.headers.get(IDEMPOTENCY_HEADER)
    if header_key is not None and not 0 < len(header_key) <= 200:
        raise GatewayError(400, f"{IDEMPOTENCY_HEADER} must be 1 to 200 characters", param=IDEMPOTENCY_HEADER,
                           code="invalid_value")
    items = []
    for index, reward in enumerate(rewards):
        if reward.comment is not None and len(reward.comment) > settings.max_comment_chars:
            name = _field(batch, index, "comment")
            raise GatewayError(400, f"{name}: longer than {settings.max_comment_chars} characters", param=name,
                               code="invalid_value")
        key_value = reward.idempotency_key
        if header_key is not None:
            derived = f"{header_key}:{index}" if batch else header_key
            if key_value is None:
                key_value = derived
            elif not batch and key_value != header_key:
                raise GatewayError(400, f"idempotency_key differs from the {IDEMPOTENCY_HEADER} header",
                                   param="idempotency_key", code="invalid_value")
        target_trajectory: uuid.UUID | None = None
        if reward.trajectory_id is not None:
            kind, target = "trajectory", reward.trajectory_id
            try:
                target_trajectory = uuid.UUID(reward.trajectory_id)
            except ValueError:
                name = _field(batch, index, "trajectory_id")
                raise GatewayError(400, f"{name}: not a trajectory id issued by the gateway; send your own ids "
                                        "as client_trajectory_id", param=name, code="invalid_value") from None
        elif reward.client_trajectory_id is not None:
            kind, target = "trajectory", reward.client_trajectory_id
            target_trajectory = client_trajectory_uuid(state, tenant, reward.client_trajectory_id)
        else:
            kind, target = "call", str(reward.call_id)
        observed_at = None
        if reward.timestamp is not None:
            stamp = reward.timestamp
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=timezone.utc)
            observed_at = stamp.timestamp()
        item: dict[str, Any] = {
            "ord": index, "id": str(stitching.uuid7()), "tenant": tenant, "target_kind": kind, "target": target,
            "target_trajectory_id": str(target_trajectory) if target_trajectory else None,
            "target_call": target if kind == "call" else None, "name": reward.name, "value": reward.reward,
            "metrics": reward.metrics or {}, "comment": reward.comment, "group_id": reward.group_id,
            "idempotency_key": key_value, "source": source, "api_key_id": str(api_key_id) if api_key_id else None,
            "observed_at": observed_at,
        }
        item["content_hash"] = content_hash(item)
        items.append(item)

    rules = _rules(request)

    def check(resolved: list[tuple[int, str | None]]) -> None:
        for index, policy in sorted(resolved):
            reward = rewards[index]
            problem = rules.check(policy, reward.name, reward.reward, reward.metrics or {})
            if problem is not None:
                name = _field(batch, index, problem.field)
                code = "reward_out_of_range" if problem.field == "reward" else "unknown_metric"
                raise GatewayError(400, f"{name}: {problem.message}", param=name, code=code)

    try:
        answers, replayed = await ingest_rewards(state.engine, items, check=check, signature=signature)
    except ReplayedSignature:
        raise GatewayError(409, "this signature was already used: sign each delivery anew", param=SIGNATURE_HEADER,
                           code="signature_replayed") from None
    linker = getattr(state, "reward_linker", None)
    if linker is not None and any(a["status"] == "pending" for a in answers):
        linker.wake()
    content = {"object": "list", "data": answers, "has_more": False} if batch else answers[0]
    headers = {REPLAYED_HEADER: "true"} if replayed else None
    return Response(orjson.dumps(content), media_type="application/json", headers=headers)


@router.get(
    "/v1/rewards/pending",
    response_model=PendingRewardListOut,
    summary="Rewards not linked to a trajectory (admin)",
    description=("Rewards still waiting for their trajectory (`overdue` once older than "
                 "`rewards.pending_window_s`) and rewards refused by their trajectory's policy when they linked "
                 "(`rejected`). Nothing is dropped: a pending reward links whenever its trajectory lands."),
)
async def pending_rewards(
    request: Request,
    status: str = Query("pending", pattern="^(pending|rejected|all)$",
                        description="`pending`, `rejected` or `all`."),
    overdue_only: bool = Query(False, description="Only pending rewards past the pending window."),
    tenant: str | None = Query(None, description="Only this tenant's rewards."),
    limit: int = Query(100, ge=1, le=1000),
) -> Response:
    state = _state(request)
    await state.authenticate(request.scope, admin=True)
    statuses = ["pending", "rejected"] if status == "all" else [status]
    result = await list_unlinked(state.engine, tenant=tenant, window_s=state.settings.rewards.pending_window_s,
                                 statuses=statuses, overdue_only=overdue_only, limit=limit)
    return Response(orjson.dumps(result), media_type="application/json")


@router.get("/v1/rewards/{reward_id}", response_model=RewardOut, summary="One stored reward",
            description="A reward by the id the gateway answered; a client key sees its own tenant's only.")
async def get_reward(request: Request, reward_id: str) -> Response:
    state = _state(request)
    key = await state.authenticate(request.scope)
    try:
        parsed = uuid.UUID(reward_id)
    except ValueError:
        raise GatewayError(404, f"no reward {reward_id!r}", param="reward_id", code="not_found") from None
    row = await load(state.engine, parsed, None if key.is_admin else key.tenant)
    if row is None:
        raise GatewayError(404, f"no reward {reward_id!r}", param="reward_id", code="not_found")
    return Response(orjson.dumps(row), media_type="application/json")

