"""Anthropic Messages' side of a translated call: its id, its answer, its stream, its errors."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.endpoints.chat_completions.wire import TranslatingWire
from gateway.endpoints.messages.errors import from_openai_error
from gateway.endpoints.messages.stream import MessagesStream
from gateway.endpoints.messages.translate import to_message
from gateway.http.asgi import JSON_HEADERS, Send, send_response
from gateway.http.errors import GatewayError


class MessagesWire(TranslatingWire):
    protocol = "messages"

    def __init__(self, body: dict[str, Any], *, message_id: str) -> None:
        self.body = body
        self.id = message_id
        self.model = str(body.get("model"))
        self.stream = MessagesStream(message_id=message_id, model=self.model)

    def response_id(self, response: dict[str, Any] | None) -> str:
        return self.id

    async def send_error(self, send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]]) -> None:
        body = from_openai_error(error.status, error.body())
        await send_response(send, error.status, body, [*JSON_HEADERS, *headers])

    def native_request(self) -> dict[str, Any]:
        return self.body

    def native_response(self, response: dict[str, Any] | None) -> dict[str, Any] | None:
        return to_message(response, message_id=self.id, model=self.model) if response else None

    def complete(self, response: dict[str, Any]) -> bytes:
        return orjson.dumps(to_message(response, message_id=self.id, model=self.model))

    def stream_start(self) -> bytes:
        return self.stream.start()

    def stream_chunks(self, chunks: list[dict[str, Any]]) -> bytes:
        return b"".join(self.stream.feed(chunk) for chunk in chunks)

    def stream_end(self, response: dict[str, Any], error: dict[str, Any] | None) -> bytes:
        return self.stream.finish(response, error)
