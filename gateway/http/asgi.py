"""Plain ASGI helpers for the proxy's hot path (no framework layers per request)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from gateway.http.errors import GatewayError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
# As in the ASGI servers' and Starlette's types: a send callable accepts any mutable mapping,
# so that ours can be handed on to FastAPI.
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def header(scope: Mapping[str, Any], name: bytes) -> str | None:
    """A request header (name in lower case), decoded; None when absent."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def body_too_large(limit: int, declared: str | None = None) -> GatewayError:
    """The gateway's one answer to an oversized body, whichever endpoint reads it."""
    size = f"request body is {declared} bytes" if declared else "request body exceeds the limit"
    return GatewayError(413, f"{size}; the limit is {limit} bytes", code="request_too_large")


def refuse_declared_length(scope: Scope, limit: int) -> None:
    """Refuse before reading when the client declares a length over the limit."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit, declared)


def limited_receive(scope: Scope, receive: Receive, limit: int) -> Receive:
    """A receive that refuses bodies over the limit, chunked ones included (for the FastAPI
    app, whose error handler turns the 413 into OpenAI's error format)."""
    received = 0

    async def counting() -> dict[str, Any]:
        nonlocal received
        refuse_declared_length(scope, limit)
        message = await receive()
        received += len(message.get("body", b""))
        if received > limit:
            raise body_too_large(limit)
        return message

    return counting


async def read_body(receive: Receive, scope: Scope, limit: int) -> bytes:
    """The whole request body, refusing more than `limit` bytes without reading it all."""
    chunks: list[bytes] = []
    next_message = limited_receive(scope, receive, limit)
    while True:
        message = await next_message()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("client disconnected while sending the request")
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_response(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = JSON_HEADERS
) -> None:
    all_headers = list(headers)
    all_headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: GatewayError, extra_headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await send_response(send, error.status, error.body(), [*JSON_HEADERS, *extra_headers])
