"""The gateway's ASGI application.

Chat completions, forwarded OpenAI endpoints and reward posts (webhooks, thousands a second)
are dispatched straight to plain ASGI handlers; everything else (models, operations, reading
rewards, admin) is a FastAPI app, which also owns startup and shutdown and documents them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.routing import Match

from apprentice.settings import Settings
from apprentice.store.schema import check_schema
from gateway import __version__
from gateway.endpoints import openapi, operations, paths
from gateway.endpoints.admin import evalsets as admin_evalsets
from gateway.endpoints.admin import exploration as admin_exploration
from gateway.endpoints.admin import judging as admin_judging
from gateway.endpoints.admin import keys as admin_keys
from gateway.endpoints.admin import routes as admin_routes
from gateway.endpoints.admin import teacher as admin_teacher
from gateway.endpoints.chat_completions.handler import ChatCompletionsEndpoint
from gateway.endpoints.messages.handler import MessagesEndpoint
from gateway.endpoints.passthrough import PassthroughEndpoint
from gateway.endpoints.responses import routes as responses_routes
from gateway.endpoints.responses.handler import ResponsesEndpoint
from gateway.endpoints.rewards import handler as rewards_handler
from gateway.endpoints.rewards import routes as rewards_routes
from gateway.endpoints.trajectories import routes as trajectories_routes
from gateway.heap import freeze_startup_heap
from gateway.http.asgi import Receive, Scope, Send, limited_receive, send_error
from gateway.http.errors import ERROR_TYPES, GatewayError, error_body
from gateway.http.query_text import refuse_nul_in_request
from gateway.state import GatewayState
from gateway.ui import routes as ui_routes

log = logging.getLogger(__name__)


def _error_response(error: GatewayError) -> Response:
    return Response(error.body(), status_code=error.status, media_type="application/json")


def build_fastapi(state: GatewayState, *, check_schema_on_start: bool) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if check_schema_on_start:
            await asyncio.to_thread(check_schema, state.database_url)
        await state.start()
        freeze_startup_heap()
        try:
            yield
        finally:
            await state.stop()

    app = FastAPI(
        title="Apprentice gateway",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI-compatible gateway that records trajectories and learns from rewards.",
        # Every route's text that could reach a query is checked once, here (gateway/http/query_text.py).
        dependencies=[Depends(refuse_nul_in_request)],
    )
    app.state.gateway = state
    app.include_router(operations.router)
    app.include_router(rewards_routes.router)
    app.include_router(trajectories_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(admin_routes.router)
    app.include_router(admin_judging.router)
    app.include_router(admin_teacher.router)
    app.include_router(admin_exploration.router)
    app.include_router(admin_evalsets.router)
    app.include_router(admin_keys.router)
    app.include_router(ui_routes.router)
    openapi.install(app)  # documents the endpoints GatewayApp serves before FastAPI, without routing them

    @app.exception_handler(GatewayError)
    async def gateway_error(_: Request, error: GatewayError) -> Response:
        return _error_response(error)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> Response:
        headers = dict(error.headers or {})
        if error.status_code == 405:
            # Starlette names the methods of the first route that matched the path only; a path
            # served by several routes (GET and DELETE) must list them all (RFC 9110).
            headers["Allow"] = ", ".join(_allowed_methods(app, request.scope))
        return Response(
            error_body(str(error.detail), ERROR_TYPES.get(error.status_code, "invalid_request_error")),
            status_code=error.status_code,
            media_type="application/json",
            headers=headers,
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> Response:
        first = error.errors()[0] if error.errors() else {}
        location = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{location}: {first.get('msg', 'invalid request')}" if location else "invalid request"
        return Response(
            error_body(message, "invalid_request_error", location or None, "invalid_value"),
            status_code=400,
            media_type="application/json",
        )

    return app


ASGIHandler = Callable[[Scope, Receive, Send], Awaitable[None]]

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(app: FastAPI, scope: MutableMapping[str, Any]) -> list[str]:
    """Every method some route of the app answers on this request's path. Asked of the routes
    themselves, method by method: an included router is one route object that hides its own."""
    return [
        method
        for method in HTTP_METHODS
        if any(route.matches({**scope, "method": method})[0] == Match.FULL for route in app.router.routes)
    ]


class GatewayApp:
    """The outer ASGI callable: hot paths first, then FastAPI, then passthrough for /v1/*."""

    def __init__(self, settings: Settings, database_url: str, *, check_schema_on_start: bool = True) -> None:
        self.state = GatewayState(settings, database_url)
        self.fastapi = build_fastapi(self.state, check_schema_on_start=check_schema_on_start)
        self.chat = ChatCompletionsEndpoint(self.state)
        self.responses = ResponsesEndpoint(self.state, self.chat)
        self.messages = MessagesEndpoint(self.state, self.chat)
        self.passthrough = PassthroughEndpoint(self.state)
        self.rewards = rewards_handler.RewardsEndpoint(self.state, self.fastapi.state)
        # POST on these paths goes straight to its handler (paths.py lists them for the document too)
        handlers: list[tuple[tuple[str, ...], ASGIHandler]] = [
            (paths.CHAT_COMPLETIONS, self.chat),
            (paths.RESPONSES, self.responses),
            (paths.MESSAGES, self.messages),
            (paths.COUNT_TOKENS, self.messages.count_tokens),
            (paths.REWARDS, self.rewards),
        ]
        self.served_first: dict[str, ASGIHandler] = {path: handler for group, handler in handlers for path in group}
        if set(self.served_first) != set(paths.SERVED_FIRST):
            raise RuntimeError("GatewayApp's handlers and gateway/endpoints/paths.py list different paths")

    def _fastapi_handles(self, scope: Scope) -> bool:
        return any(route.matches(scope)[0] != Match.NONE for route in self.fastapi.router.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            handler = self.served_first.get(path) if scope["method"] == "POST" else None
            if handler is not None:
                await handler(scope, receive, send)
                return
            if path in paths.POST_ONLY:
                await send_error(send, GatewayError(405, "Method Not Allowed"), [(b"allow", b"POST")])
                return
            if path.startswith("/v1/") and not self._fastapi_handles(scope):
                await self.passthrough(scope, receive, send)
                return
            receive = limited_receive(scope, receive, self.state.settings.limits.max_body_bytes)
        await self.fastapi(scope, receive, send)


def create_app(settings: Settings, database_url: str, *, check_schema_on_start: bool = True) -> GatewayApp:
    return GatewayApp(settings, database_url, check_schema_on_start=check_schema_on_start)
