"""Other OpenAI endpoints (embeddings, moderations, files, ...), forwarded unchanged.

Pointing OPENAI_BASE_URL at the gateway must break nothing a client already does. Such calls
are authenticated and forwarded to the deployment of the `model` they name, or to the
default upstream; they are not recorded as calls (only chat completions make trajectories).
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from gateway import metrics
from gateway.http.asgi import Receive, Scope, Send, read_body, send_error
from gateway.http.errors import GatewayError
from gateway.limits.limiter import RateLimited, estimate_tokens
from gateway.state import GatewayState

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"content-length",
    b"content-encoding",
    b"host",
    b"authorization",
    b"upgrade",
    b"te",
    b"trailer",
    b"proxy-authorization",
}
ENDPOINT = "passthrough"


class PassthroughEndpoint:
    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            key = await self.state.authenticate(scope)
            body = await read_body(receive, scope, self.state.settings.limits.max_body_bytes)
            # Limits: the request and its estimated tokens count (the answer is not parsed here).
            admission = self.state.limiter.admit(key, estimate_tokens(len(body)))
            model = None
            if body[:1] == b"{":
                try:
                    model = orjson.loads(body).get("model")
                except (orjson.JSONDecodeError, AttributeError):
                    model = None
            target = self.state.router.target_for_other_endpoint(model if isinstance(model, str) else None)
            if target is None or not target.direct:
                raise GatewayError(
                    404, f"no OpenAI-compatible upstream is configured for {scope['path']}", code="no_upstream"
                )
            if isinstance(model, str) and model != target.upstream_model and model == target.name:
                body = orjson.dumps({**orjson.loads(body), "model": target.upstream_model})
            path = scope["path"][len("/v1") :]
            query = scope.get("query_string", b"").decode()
            url = target.api_base + path + (f"?{query}" if query else "")
            headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k not in HOP_BY_HOP}
            if target.api_key:
                headers["Authorization"] = f"Bearer {target.api_key}"
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=target.timeout)
            try:
                response = await self.state.http.request(
                    scope["method"], url, data=body or None, headers=headers, timeout=timeout
                )
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                metrics.UPSTREAM_ERRORS.labels(target.name, "unreachable").inc()
                raise GatewayError(
                    502,
                    f"upstream {target.name} did not answer: {type(exc).__name__}: {exc}",
                    code="upstream_unavailable",
                ) from exc
        except GatewayError as error:
            metrics.REQUESTS.labels(ENDPOINT, metrics.status_class(error.status)).inc()
            await send_error(send, error, error.headers if isinstance(error, RateLimited) else ())
            return
        except ConnectionResetError:
            return
        async with response:
            out_headers = [
                (k.lower().encode(), v.encode("latin-1"))
                for k, v in response.headers.items()
                if k.lower().encode() not in HOP_BY_HOP
            ]
            out_headers += admission.headers
            await send({"type": "http.response.start", "status": response.status, "headers": out_headers})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        metrics.REQUESTS.labels(ENDPOINT, metrics.status_class(response.status)).inc()
