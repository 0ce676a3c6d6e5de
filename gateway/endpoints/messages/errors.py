"""Errors in Anthropic's format, for `POST /v1/messages`.

Anthropic's clients (the official SDKs, Claude Code) read an error as

    {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}

and pick the exception class by HTTP status; the `error.type` is what they show and what
some of them branch on (Claude Code treats `overloaded_error` as "retry later"). The types
by status are Anthropic's documented ones (docs.anthropic.com, "Errors"); statuses Anthropic
does not document get the nearest type: other 4xx are invalid requests, other 5xx api errors.

The same body, as the data of an `event: error` server-sent event, is how Anthropic reports
an error after a stream has started (see stream.py).
"""

from __future__ import annotations

from typing import Any

import orjson

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    # Our upstreams' "unavailable" means what Anthropic's 529 means: try again later.
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type_for(status: int) -> str:
    """Anthropic's `error.type` for an HTTP status."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_object(status: int, message: str, error_type: str | None = None) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`, the type by status unless given."""
    return {"type": "error", "error": {"type": error_type or error_type_for(status), "message": message}}


def error_body(status: int, message: str, error_type: str | None = None) -> bytes:
    """The JSON body of an error answer (see the module docstring for the types by status)."""
    return orjson.dumps(error_object(status, message, error_type))


class MessagesError(Exception):
    """A Messages request the gateway refuses, answered with `status` and Anthropic's error body.

    `message` names the offending field the way Anthropic does (`messages.2.content.0.tool_use_id:
    Field required`), so a client's log points at the part of its request to fix.
    """

    def __init__(self, status: int, message: str, *, error_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or error_type_for(status)

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.error_type)


def invalid(path: str, problem: str) -> MessagesError:
    """A 400 naming the field: `invalid("messages.0.role", "Field required")`."""
    return MessagesError(400, f"{path}: {problem}" if path else problem)


def from_openai_error(status: int, raw: bytes | dict[str, Any] | None) -> bytes:
    """An upstream's (or the chat pipeline's) OpenAI-format error, in Anthropic's format.

    The message is kept (`{"error": {"message": ...}}`, or `{"error": "..."}` as old vLLM
    wrote it, or a top-level `message`); the type follows the status, since OpenAI's types
    (`server_error`, `upstream_error`, ...) mean nothing to an Anthropic client.
    """
    parsed: Any = raw
    if isinstance(raw, (bytes, bytearray)):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = None
        if parsed is None:
            text = bytes(raw).decode("utf-8", "replace").strip()
            return error_body(status, text or f"upstream error (HTTP {status})")
    return error_body(status, openai_error_message(parsed) or f"upstream error (HTTP {status})")


def openai_error_message(parsed: Any) -> str | None:
    """The message of an OpenAI-format error object (wrapped in `error` or not)."""
    if not isinstance(parsed, dict):
        return None
    inner = parsed.get("error", parsed)
    if isinstance(inner, str):
        return inner
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return str(inner["message"])
    if isinstance(parsed.get("message"), str):
        return str(parsed["message"])
    return None
