"""GET /v1/responses/{id} and GET /v1/responses/{id}/input_items, answered from the record.

Every Responses call the gateway served is recorded with its answer (translated calls with
the Responses object the client received, forwarded ones with the upstream's), so a response
can be read back even when the upstream did not keep it (our own endpoints keep nothing; a
client may have sent `store: false`). A key sees its own tenant's responses only. A response
answered moments ago by another process lands within about a second; the lookup waits that long.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response
from psycopg.rows import dict_row

from gateway.endpoints.responses.translate import input_items
from gateway.http.documented import CLIENT, error_responses
from gateway.http.errors import GatewayError
from gateway.http.responses import dumps
from gateway.state import GatewayState
from gateway.store.connection import driver_connection

NOT_RECORDED = "No recorded response with this id for this key's tenant."
router = APIRouter(
    tags=["responses"], dependencies=[CLIENT], responses=error_responses(401, 404, 503, s404=NOT_RECORDED)
)

STORE_WAIT_S = 2.0

_RECORDED = """
SELECT native_request, native_response, request, response FROM calls
WHERE response_id = %(id)s AND tenant = %(tenant)s AND protocol = 'responses' AND status_code = 200
ORDER BY created_at DESC LIMIT 1
"""


async def _recorded(state: GatewayState, tenant: str, response_id: str) -> dict[str, Any] | None:
    deadline = asyncio.get_running_loop().time() + STORE_WAIT_S
    while True:
        async with state.engine.connect() as connection:
            pg = await driver_connection(connection)
            async with pg.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(_RECORDED, {"id": response_id, "tenant": tenant})
                row = await cursor.fetchone()
        if row is not None or asyncio.get_running_loop().time() >= deadline:
            return row
        await asyncio.sleep(0.1)


async def _found(request: Request, response_id: str) -> dict[str, Any]:
    state: GatewayState = request.app.state.gateway
    key = await state.authenticate(request.scope)
    row = await _recorded(state, key.tenant, response_id)
    if row is None:
        raise GatewayError(
            404, f"No response found with id '{response_id}'.", param="response_id", code="response_not_found"
        )
    return row


@router.get(
    "/v1/responses/{response_id}",
    summary="A response, as the client received it",
    description="Read back from the record: works for responses our own endpoints answered (they keep none).",
)
async def get_response(request: Request, response_id: str) -> Response:
    row = await _found(request, response_id)
    return Response(dumps(row["native_response"] or row["response"]), media_type="application/json")


@router.get(
    "/v1/responses/{response_id}/input_items",
    summary="The input items of a response",
)
async def get_input_items(
    request: Request,
    response_id: str,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = Query("desc"),
    after: str | None = Query(None, description="An item id: list the items after it."),
) -> Response:
    row = await _found(request, response_id)
    items = input_items(row["native_request"] or row["request"], response_id=response_id)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise GatewayError(400, f"no input item {after!r} in response {response_id!r}", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    answer = {
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": len(items) > limit,
    }
    return Response(dumps(answer), media_type="application/json")
