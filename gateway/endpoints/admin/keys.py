"""/v1/admin/keys: gateway API keys and their own limits, for operators (admin key).

The same operations as `apprentice keys` (gateway/commands/keys.py), over HTTP: list, create
(the clear key is in the answer once), set a key's limits, revoke. The answering process
refreshes its key cache at once; every other gateway process applies a change within
`auth.key_cache_ttl_s` (docs/limits.md).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from apprentice.settings import RateLimits
from gateway.auth.keys import create_key, list_keys, parse_limits, revoke_key, set_key_limits
from gateway.endpoints.admin.routes import _admin
from gateway.http.documented import ADMIN, error_responses
from gateway.http.errors import GatewayError
from gateway.http.responses import model_response

# Text PostgreSQL can store (no NUL) and a key's id or listed prefix (`apk-` + URL-safe base64).
TEXT_PATTERN = r"^[^\x00]+$"
KEY_ID = Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="The key's id or listed prefix.")

router = APIRouter(tags=["admin"], dependencies=[ADMIN], responses=error_responses(401, 403, 503))


class KeyOut(BaseModel):
    id: uuid.UUID
    name: str
    tenant: str
    role: str
    key_prefix: str
    created_at: datetime
    revoked_at: datetime | None
    limits: dict[str, Any] = Field(description="The key's own limits (RateLimits fields); absent ones: the defaults.")
    invalid_limits: str | None = Field(
        default=None,
        description="Why the stored limits are ignored (written by hand and out of range): the key has the defaults.",
    )


class KeyListOut(BaseModel):
    keys: list[KeyOut]


class KeyCreateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=TEXT_PATTERN)
    tenant: str = Field(default="default", min_length=1, max_length=200, pattern=TEXT_PATTERN)
    role: Literal["client", "admin"] = "client"
    limits: RateLimits | None = None


class KeyCreatedOut(BaseModel):
    key: str = Field(description="The clear key: shown once, only its sha256 is stored.")
    id: uuid.UUID | None
    name: str
    tenant: str
    role: str
    limits: dict[str, Any]


class KeyLimitsOut(BaseModel):
    id: str
    limits: dict[str, Any]


class KeyRevokedOut(BaseModel):
    id: str
    revoked: bool


def _given(limits: RateLimits | None) -> dict[str, Any]:
    """Only the fields the request set (an explicit null lifts that limit for the key)."""
    return limits.model_dump(exclude_unset=True) if limits is not None else {}


@router.get("/v1/admin/keys", response_model=KeyListOut, summary="API keys (prefixes only) and their limits")
async def admin_list_keys(request: Request) -> Response:
    state, _ = await _admin(request)
    rows = await list_keys(state.engine)
    return model_response(KeyListOut(keys=[KeyOut.model_validate(row) for row in rows]))


@router.post(
    "/v1/admin/keys",
    response_model=KeyCreatedOut,
    status_code=201,
    summary="Create an API key, with its own limits if given",
    responses=error_responses(400),
)
async def admin_create_key(request: Request, body: KeyCreateIn) -> Response:
    state, _ = await _admin(request)
    info, key = await create_key(
        state.engine, name=body.name, tenant=body.tenant, role=body.role, limits=_given(body.limits)
    )
    await state.keys.refresh()
    out = KeyCreatedOut(
        key=key, id=info.id, name=info.name, tenant=info.tenant, role=info.role, limits=dict(info.limits)
    )
    response = model_response(out)
    response.status_code = 201
    return response


@router.put(
    "/v1/admin/keys/{key_id}/limits",
    response_model=KeyLimitsOut,
    summary="Set a key's own limits (the whole set; {} returns it to the defaults)",
    responses=error_responses(400, 404),
)
async def admin_set_key_limits(request: Request, body: RateLimits, key_id: str = KEY_ID) -> Response:
    state, _ = await _admin(request)
    try:
        limits = parse_limits(_given(body))
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="limits", code="invalid_value") from None
    updated = await set_key_limits(state.engine, key_id, limits, replace=True)
    if updated is None:
        raise GatewayError(404, f"no active key {key_id!r}", param="key_id", code="key_not_found")
    await state.keys.refresh()
    return model_response(KeyLimitsOut(id=key_id, limits=updated))


@router.delete(
    "/v1/admin/keys/{key_id}",
    response_model=KeyRevokedOut,
    summary="Revoke a key (by id or the prefix the listing shows)",
    responses=error_responses(400, 404),
)
async def admin_revoke_key(request: Request, key_id: str = KEY_ID) -> Response:
    state, _ = await _admin(request)
    if not await revoke_key(state.engine, key_id):
        raise GatewayError(404, f"no active key {key_id!r}", param="key_id", code="key_not_found")
    await state.keys.refresh()
    return model_response(KeyRevokedOut(id=key_id, revoked=True))
