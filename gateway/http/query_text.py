"""The one check on client text that reaches a database query: no NUL character.

PostgreSQL's text cannot hold NUL (`\\x00`): a filter, id or name carrying one fails inside the
driver (`psycopg.DataError`) as a 500. Every request the FastAPI app serves (admin, trajectories,
reading responses and rewards, the dashboard) passes `refuse_nul_in_request`, an app-wide
dependency: its path, query and header parameters and every string of its JSON body are checked
before any route runs, and the first one with a NUL is refused with 400 naming it. The plain ASGI
handlers that put client text into a query call the same functions: rewards (their whole body)
and a translated Responses call's `previous_response_id`.

What is only recorded is not refused: a chat, Responses or Messages body may carry NUL in its
messages (the upstream decides), and the journal stores it as U+FFFD (gateway/store/calls.py).

`NUL_FREE` is the pattern the OpenAPI document gives every string parameter and request field of
these routes (gateway/endpoints/openapi.py), so the document says what the check refuses.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from gateway.http.errors import GatewayError

NUL = "\x00"
NUL_FREE = r"^[^\x00]*$"


def nul_error(param: str) -> GatewayError:
    return GatewayError(400, f"{param}: must not contain NUL characters (\\u0000)", param=param, code="invalid_value")


def refuse_nul(value: str, param: str) -> None:
    """A 400 naming `param` when the value holds a NUL character."""
    if NUL in value:
        raise nul_error(param)


def nul_in_json(data: Any, path: str = "") -> str | None:
    """Where the first string (or object key) holding a NUL is in a parsed JSON value, as
    `a.b[2].c`; None when there is none."""
    if isinstance(data, str):
        return (path or "body") if NUL in data else None
    if isinstance(data, dict):
        children = [(f"{path}.{key}" if path else str(key), key, value) for key, value in data.items()]
    elif isinstance(data, list):
        children = [(f"{path}[{index}]", "", value) for index, value in enumerate(data)]
    else:
        return None
    for inner, key, value in children:
        found = inner if NUL in key else nul_in_json(value, inner)
        if found is not None:
            return found
    return None


def refuse_nul_in_json(data: Any) -> None:
    param = nul_in_json(data)
    if param is not None:
        raise nul_error(param)


async def refuse_nul_in_request(request: Request) -> None:
    """The FastAPI app's dependency (every route): path, query and header parameters, then the
    JSON body. A body that is not JSON is left to the route, which refuses it in its own words."""
    for name, value in request.path_params.items():
        if isinstance(value, str):
            refuse_nul(value, name)
    for name, value in request.query_params.multi_items():
        refuse_nul(name, name)
        refuse_nul(value, name)
    for name, value in request.headers.items():
        refuse_nul(value, name)
    content_type = request.headers.get("content-type", "")
    if request.method in ("POST", "PUT", "PATCH") and "json" in content_type:
        try:
            data = await request.json()
        except ValueError:
            return
        refuse_nul_in_json(data)
