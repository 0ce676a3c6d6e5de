"""The Responses API's side of a translated call: its id, its answer, its stream, its record."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from gateway.endpoints.chat_completions.wire import TranslatingWire
from gateway.endpoints.responses.history import Previous, ResponseHistory
from gateway.endpoints.responses.stream import ResponsesStream
from gateway.endpoints.responses.translate import continued_messages, to_response


class ResponsesWire(TranslatingWire):
    protocol = "responses"

    def __init__(
        self,
        body: dict[str, Any],
        chat_request: dict[str, Any],
        *,
        response_id: str,
        created_at: float,
        tenant: str,
        history: ResponseHistory,
    ) -> None:
        self.body = body
        self.chat_request = chat_request
        self.id = response_id
        self.created_at = created_at
        self.tenant = tenant
        self.history = history
        self.stream = ResponsesStream(response_id=response_id, request=body, created_at=created_at)

    def _response(self, chat: dict[str, Any]) -> dict[str, Any]:
        return to_response(chat, response_id=self.id, request=self.body, created_at=self.created_at)

    def response_id(self, response: dict[str, Any] | None) -> str:
        return self.id

    def native_request(self) -> dict[str, Any]:
        return self.body

    def native_response(self, response: dict[str, Any] | None) -> dict[str, Any] | None:
        return self._response(response) if response else None

    def recorded(self, response: dict[str, Any] | None, trajectory_id: uuid.UUID) -> None:
        if response:
            conversation = continued_messages(self.body, self.chat_request, response)
            self.history.remember(self.tenant, self.id, Previous(conversation, trajectory_id))

    def complete(self, response: dict[str, Any]) -> bytes:
        return orjson.dumps(self._response(response))

    def stream_start(self) -> bytes:
        return self.stream.start()

    def stream_chunks(self, chunks: list[dict[str, Any]]) -> bytes:
        return b"".join(self.stream.feed(chunk) for chunk in chunks)

    def stream_end(self, response: dict[str, Any], error: dict[str, Any] | None) -> bytes:
        return self.stream.finish(response, error)
