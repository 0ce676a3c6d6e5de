"""Errors in OpenAI's format: `{"error": {"message", "type", "param", "code"}}`.

Clients built on the official SDKs turn these into typed exceptions (BadRequestError,
AuthenticationError, NotFoundError, ...), so the gateway's own errors must look the same.
"""

from __future__ import annotations

import orjson

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """An error the gateway answers itself, with an HTTP status and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or ERROR_TYPES.get(status, "invalid_request_error")

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.param, self.code)

    def as_dict(self) -> dict[str, object]:
        return orjson.loads(self.body())


class UpstreamStatusError(GatewayError):
    """The upstream answered with an error status: the client gets that status and body."""

    def __init__(self, status: int, openai_body: bytes) -> None:
        super().__init__(status, "upstream error", error_type=ERROR_TYPES.get(status, "upstream_error"))
        self._body = openai_body

    def body(self) -> bytes:
        return self._body


def error_body(
    message: str, error_type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


def as_openai_error(status: int, raw: bytes) -> bytes:
    """An upstream's error body, kept when already in OpenAI's shape, wrapped otherwise."""
    try:
        parsed = orjson.loads(raw)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            return raw
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):  # vLLM < 0.6 style
            return error_body(parsed["error"], ERROR_TYPES.get(status, "upstream_error"))
        if isinstance(parsed, dict) and "message" in parsed:
            return error_body(str(parsed["message"]), ERROR_TYPES.get(status, "upstream_error"))
    except orjson.JSONDecodeError:
        pass
    text = raw.decode("utf-8", "replace").strip()[:2000] or f"upstream answered HTTP {status}"
    return error_body(f"upstream error: {text}", ERROR_TYPES.get(status, "upstream_error"))
