"""The skeleton every endpoint of another protocol shares (Messages, Responses), written once.

Such an endpoint has two ways through, chosen by where the model goes:
- an upstream that speaks the protocol itself (the deployment lists it in `protocols`) gets the
  client's bytes as they are (gateway/endpoints/native.py), recorded with the native answer;
- a policy (our endpoints speak chat completions only) or any other deployment gets the call
  translated to chat completions and run through the chat pipeline (recorded with exact token
  ids: what the learner trains on), then answered in the protocol's own wire format.

A subclass says only what differs: how it authenticates and parses, how it translates, and how
it writes a refusal. Everything refused before the chat pipeline runs is counted and answered in
the protocol's own error format; a client that hung up gets nothing.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol, cast

from apprentice.grouping import FAMILY_HEADER
from gateway import metrics
from gateway.auth.keys import KeyInfo
from gateway.endpoints.chat_completions.handler import ChatCompletionsEndpoint
from gateway.endpoints.chat_completions.request import ChatRequest, optional_name
from gateway.endpoints.chat_completions.wire import Wire
from gateway.endpoints.native import NativeProtocol, forward_request
from gateway.http.asgi import Receive, Scope, Send, header, read_body
from gateway.http.errors import GatewayError
from gateway.state import GatewayState
from gateway.upstreams.routing import RoutePlan


class Refusal(Protocol):
    """What every refusal carries, whichever protocol's exception it is."""

    status: int
    message: str


@dataclass(frozen=True)
class ClientNames:
    """What the client named of its call in the headers: its run, its group, its task family."""

    trajectory: str | None
    group: str | None
    family: str | None

    @classmethod
    def of(cls, scope: Scope) -> ClientNames:
        """The names in the headers, each checked as chat completions check them (a blank one is a
        400 naming the header, in the protocol's format), whether the call is translated or
        forwarded natively."""
        return cls(
            optional_name(header(scope, b"x-trajectory-id"), "X-Trajectory-Id"),
            optional_name(header(scope, b"x-group-id"), "X-Group-Id"),
            optional_name(header(scope, b"x-task-family"), FAMILY_HEADER),
        )


class TranslatingEndpoint(ABC):
    native: NativeProtocol
    # the exceptions that are refusals of the request (answered, counted), besides GatewayError
    protocol_errors: tuple[type[Exception], ...] = ()

    def __init__(self, state: GatewayState, chat: ChatCompletionsEndpoint) -> None:
        self.state = state
        self.chat = chat
        self.limit = state.settings.limits.max_body_bytes

    def speaks_natively(self, plan: RoutePlan) -> bool:
        """A model that is no policy, routed to an upstream that lists this protocol."""
        return plan.policy is None and bool(plan.targets) and self.native.name in plan.targets[0].protocols

    async def authenticate(self, scope: Scope) -> KeyInfo:
        return await self.state.authenticate(scope)

    @abstractmethod
    def parse(self, raw: bytes) -> dict[str, Any]:
        """The request body as a JSON object naming a model, or a refusal in the protocol's format."""

    @abstractmethod
    async def translate(
        self,
        key: KeyInfo,
        body: dict[str, Any],
        created_at: float,
        named: ClientNames,
    ) -> tuple[ChatRequest, Wire]:
        """The chat request to run, and the wire that answers it in this protocol."""

    @abstractmethod
    async def send_refusal(self, send: Send, error: Refusal) -> None:
        """A refusal written in this protocol's error format."""

    async def accept(self, scope: Scope, receive: Receive) -> tuple[KeyInfo, bytes, dict[str, Any], RoutePlan]:
        """The caller's key, the body as sent and parsed, and where its model goes."""
        key = await self.authenticate(scope)
        raw = await read_body(receive, scope, self.limit)
        body = self.parse(raw)
        return key, raw, body, self.chat.plan(body["model"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        created_at = time.time()
        refusals: tuple[type[Exception], ...] = (GatewayError, *self.protocol_errors)
        try:
            key, raw, body, plan = await self.accept(scope, receive)
            named = ClientNames.of(scope)
            if self.speaks_natively(plan):
                await forward_request(
                    self.state,
                    self.native,
                    key,
                    body,
                    raw,
                    plan,
                    scope,
                    send,
                    client_trajectory_id=named.trajectory,
                    group_id=named.group,
                    started=started,
                    created_at=created_at,
                )
                return
            request, wire = await self.translate(key, body, created_at, named)
        except refusals as error:
            refusal = cast(Refusal, error)  # every listed exception carries a status and a message
            metrics.REQUESTS.labels(self.native.name, metrics.status_class(refusal.status)).inc()
            await self.send_refusal(send, refusal)
            return
        except ConnectionResetError:
            return
        await self.chat.serve(key, request, plan, send, started=started, created_at=created_at, wire=wire)
