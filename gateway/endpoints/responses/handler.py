"""POST /v1/responses: the OpenAI Responses API, recorded like chat completions.

Two ways through, chosen by where the model goes:
- an upstream that speaks the Responses API itself (`openai/` deployments, or any with
  `protocols: [responses]`) gets the client's bytes as they are (gateway/endpoints/native.py);
- a policy (our own endpoints speak chat completions only) or any other deployment gets the
  call translated to chat completions, run through the chat pipeline (recorded with exact token
  ids: what the learner trains on), and answered back as a Responses object or event stream
  (translate.py, stream.py, wire.py). `previous_response_id` is expanded to the conversation
  it names (history.py), so the call also continues that response's trajectory.
"""

from __future__ import annotations

from typing import Any

from gateway.auth.keys import KeyInfo
from gateway.endpoints.chat_completions.handler import ChatCompletionsEndpoint
from gateway.endpoints.chat_completions.request import ChatRequest, parse_model_request
from gateway.endpoints.native import NativeProtocol, chain_keys, response_chain_key
from gateway.endpoints.responses.history import ResponseHistory
from gateway.endpoints.responses.translate import to_chat_request
from gateway.endpoints.responses.wire import ResponsesWire
from gateway.endpoints.translating import ClientNames, Refusal, TranslatingEndpoint
from gateway.http.asgi import Send, send_error
from gateway.http.errors import GatewayError
from gateway.http.query_text import refuse_nul
from gateway.state import GatewayState
from gateway.trajectories.stitching import MessageKeys, uuid7
from gateway.upstreams.routing import UpstreamTarget

PROTOCOL = "responses"
PASSED_HEADERS = ("openai-organization", "openai-project", "openai-beta")


class ResponsesNative(NativeProtocol):
    name = PROTOCOL
    path = "/responses"

    def headers(self, target: UpstreamTarget, client_headers: dict[str, str]) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        headers.update({k: v for k, v in client_headers.items() if k in PASSED_HEADERS})
        if target.api_key:
            headers["Authorization"] = f"Bearer {target.api_key}"
        return headers

    def answer_from_events(self, events: list[dict[str, Any]]) -> dict[str, Any] | None:
        for event in reversed(events):
            if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                response = event.get("response")
                return response if isinstance(response, dict) else None
        return None

    def usage(self, answer: dict[str, Any]) -> tuple[int | None, int | None]:
        usage = answer.get("usage") or {}
        return usage.get("input_tokens"), usage.get("output_tokens")

    def keys(self, tenant: str, model: str, body: dict[str, Any]) -> MessageKeys:
        previous = body.get("previous_response_id")
        return chain_keys(tenant, model, previous if isinstance(previous, str) else None)

    def continuation(self, keys: MessageKeys, tenant: str, answer: dict[str, Any]) -> list[bytes]:
        return [response_chain_key(tenant, answer["id"])] if isinstance(answer.get("id"), str) else []

    async def send_error(self, send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]]) -> None:
        await send_error(send, error, headers)


NATIVE = ResponsesNative()


class ResponsesEndpoint(TranslatingEndpoint):
    native = NATIVE

    def __init__(self, state: GatewayState, chat: ChatCompletionsEndpoint) -> None:
        super().__init__(state, chat)
        self.history = ResponseHistory(state.engine)

    def parse(self, raw: bytes) -> dict[str, Any]:
        return parse_model_request(raw)

    async def send_refusal(self, send: Send, error: Refusal) -> None:
        assert isinstance(error, GatewayError)  # the only refusal this protocol raises
        await send_error(send, error)

    async def translate(
        self,
        key: KeyInfo,
        body: dict[str, Any],
        created_at: float,
        named: ClientNames,
    ) -> tuple[ChatRequest, ResponsesWire]:
        previous = None
        previous_id = body.get("previous_response_id")
        if previous_id is not None:
            if not isinstance(previous_id, str) or not previous_id:
                raise GatewayError(400, "previous_response_id must be a non-empty string", param="previous_response_id")
            refuse_nul(previous_id, "previous_response_id")  # looked up in the record
            previous = await self.history.previous(key.tenant, previous_id)
            if previous is None:
                raise GatewayError(
                    400,
                    f"Previous response with id '{previous_id}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
        chat_body = to_chat_request(body, previous.conversation if previous else None)
        chat_body["model"] = body["model"]
        wire = ResponsesWire(
            body,
            chat_body,
            response_id=f"resp_{uuid7().hex}",
            created_at=created_at,
            tenant=key.tenant,
            history=self.history,
        )
        # The named previous response decides the trajectory (its id, issued to this tenant, is
        # taken as it is), unless the client names its run itself.
        trajectory = named.trajectory
        if trajectory is None and previous is not None:
            trajectory = str(previous.trajectory_id)
        return ChatRequest.translated(chat_body, trajectory, named.group, named.family), wire
