"""POST /v1/rewards as a plain ASGI handler, dispatched by gateway/app.py before FastAPI.

Webhooks post one reward per run, thousands a second at scale; FastAPI's layers (middleware,
routing, dependencies) cost a fifth of such a request's time in the gateway. This handler
reads the body under the gateway's body limit and answers through the same function as the
declared FastAPI route (`answer_post`), which stays in the OpenAPI document.
"""

from __future__ import annotations

from starlette.datastructures import State

from gateway.endpoints.rewards.routes import answer_post
from gateway.http.asgi import Receive, Scope, Send, read_body, send_response
from gateway.http.errors import GatewayError
from gateway.state import GatewayState


class RewardsEndpoint:
    def __init__(self, state: GatewayState, holder: State) -> None:
        self.state = state
        self.holder = holder  # the FastAPI app's state: what the route builds on first use is shared

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(receive, scope, self.state.settings.limits.max_body_bytes)
            response = await answer_post(self.state, self.holder, scope, body)
        except GatewayError as error:
            await send_response(send, error.status, error.body())
            return
        except ConnectionResetError:  # the client went away before its body arrived
            return
        await response(scope, receive, send)
