"""Providers that do not speak the OpenAI wire format, through litellm.

litellm is imported on first use only (about 3.7 s), with its price map read from the
package instead of the internet.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.http.errors import GatewayError, error_body
from gateway.upstreams.routing import UpstreamTarget

_litellm: Any = None


def _module() -> Any:
    global _litellm
    if _litellm is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.telemetry = False
        litellm.suppress_debug_info = True
        _litellm = litellm
    return _litellm


def _arguments(target: UpstreamTarget, body: dict[str, Any]) -> dict[str, Any]:
    arguments = {k: v for k, v in body.items() if k not in ("model", "messages")}
    arguments.update(target.litellm_params)
    arguments.update(model=target.litellm_model, messages=body["messages"], timeout=target.timeout, num_retries=0)
    if target.api_key:
        arguments["api_key"] = target.api_key
    if target.api_base and target.litellm_model and not target.api_base.startswith("https://api.openai.com"):
        arguments["api_base"] = target.api_base
    return arguments


def _as_gateway_error(exc: Exception) -> GatewayError:
    status = int(getattr(exc, "status_code", 502) or 502)
    message = str(getattr(exc, "message", None) or exc)
    return GatewayError(status, f"upstream error: {message}", code="upstream_error")


async def complete(target: UpstreamTarget, body: dict[str, Any]) -> dict[str, Any]:
    litellm = _module()
    try:
        response = await litellm.acompletion(**_arguments(target, body))
    except Exception as exc:  # litellm maps provider errors to exceptions with status_code
        raise _as_gateway_error(exc) from exc
    return response.model_dump(exclude_none=False)


async def stream(target: UpstreamTarget, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """SSE bytes in the OpenAI format, ending with `data: [DONE]`."""
    litellm = _module()
    try:
        chunks = await litellm.acompletion(**_arguments(target, body))
    except Exception as exc:
        raise _as_gateway_error(exc) from exc

    async def events() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield b"data: " + orjson.dumps(chunk.model_dump(exclude_none=True)) + b"\n\n"
        except Exception as exc:
            error = _as_gateway_error(exc)
            yield b"data: " + error_body(error.message, error.error_type) + b"\n\n"
        yield b"data: [DONE]\n\n"

    return events()
