"""What the OpenAPI document says about keys and errors, shared by every route declaration.

Why a module of its own: the FastAPI routes (rewards, trajectories, admin, ...) and the
documentation-only declarations of gateway/endpoints/openapi.py must describe the same key
schemes and the same error statuses, or the document contradicts itself and a fuzzer
(tests/test_schemathesis.py) finds answers the document does not declare.

The security schemes are FastAPI's own (`Security(...)` in a route's dependencies puts them in
the document); they are built with `auto_error=False`, so as dependencies they only read a
header and never answer: `GatewayState.authenticate` stays the one place that refuses a key.
"""

from __future__ import annotations

from typing import Any

from fastapi import Security
from fastapi.params import Depends
from fastapi.security import APIKeyHeader, HTTPBearer

GATEWAY_KEY = HTTPBearer(
    scheme_name="GatewayKey",
    description="A gateway key (`apprentice keys create`); none is needed with `auth.mode: open`.",
    auto_error=False,
)
ADMIN_KEY = HTTPBearer(
    scheme_name="AdminKey",
    description="The admin key (`auth.admin_key`, or a key created with `--admin`); a client key is refused with "
    "403. None is needed with `auth.mode: open`.",
    auto_error=False,
)
ANTHROPIC_KEY = APIKeyHeader(
    name="x-api-key",
    scheme_name="AnthropicApiKey",
    description="A gateway key, as Anthropic's clients send `ANTHROPIC_API_KEY` (`Authorization: Bearer` works too).",
    auto_error=False,
)

# As route dependencies: `dependencies=[CLIENT]` documents that the route takes a gateway key.
CLIENT: Depends = Security(GATEWAY_KEY)
ADMIN: Depends = Security(ADMIN_KEY)

# The statuses the gateway answers itself, in general terms; a route that means something more
# precise by one of them passes its own description. The body is OpenAI's error format, which
# openapi.py adds to every 4xx and 5xx answer that names no content.
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "The request is malformed (`error.param` names the field).",
    401: "No API key, or an unknown or revoked one.",
    403: "The endpoint needs the admin key.",
    404: "Nothing with this id (for this key's tenant).",
    409: "The request conflicts with the current state (`error.message` says how).",
    413: "The body is over `limits.max_body_bytes`.",
    429: "Too many requests for this key (see `Retry-After`), or the upstream's rate limit.",
    502: "An upstream or model endpoint did not answer, or answered with something unusable.",
    503: "The key store is unreachable for a key not yet known.",
}


def error_responses(*statuses: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: each status with its description (`s404="..."` overrides one)."""
    answers: dict[int | str, dict[str, Any]] = {
        status: {"description": descriptions.get(f"s{status}", ERROR_DESCRIPTIONS[status])} for status in statuses
    }
    return answers
