"""How a call's answer reaches its client: in the protocol the client spoke.

The chat pipeline (handler.py) routes, forwards, records and streams chat completions. The
other protocols agents speak (OpenAI Responses, Anthropic Messages) reach a policy's own
endpoints, which speak only chat completions, translated: their endpoint turns the request
into a chat request before the pipeline, and a `Wire` turns the answer back after it, streamed
events included. The pipeline records the chat form (exact token ids, what the learner
trains on) and, for a translated call, the native request and answer beside it.

Chat completions' own wire is the identity: the upstream's bytes reach the client untouched
(the hot path); nothing here runs for it.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any

from gateway.http.asgi import Send, send_error
from gateway.http.errors import GatewayError


class Wire:
    """Chat completions: the answer as the upstream gave it, errors in OpenAI's format."""

    protocol = "chat.completions"

    def response_id(self, response: dict[str, Any] | None) -> str | None:
        """The id the client holds for this call (rewards and lookups accept it)."""
        return (response or {}).get("id")

    async def send_error(self, send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]]) -> None:
        await send_error(send, error, headers)

    def native_request(self) -> dict[str, Any] | None:
        """The request as the client sent it, when it was translated (else the chat request is it)."""
        return None

    def native_response(self, response: dict[str, Any] | None) -> dict[str, Any] | None:
        return None

    def recorded(self, response: dict[str, Any] | None, trajectory_id: uuid.UUID) -> None:
        """Called once the call is journaled (e.g. to remember a conversation for the next call)."""


class TranslatingWire(Wire, ABC):
    """A protocol whose answers are translated from chat completions (see the module docstring)."""

    @abstractmethod
    def complete(self, response: dict[str, Any]) -> bytes:
        """The client's body for a whole chat completion."""

    @abstractmethod
    def stream_start(self) -> bytes:
        """Events before the first chunk (e.g. `response.created`, `message_start`)."""

    @abstractmethod
    def stream_chunks(self, chunks: list[dict[str, Any]]) -> bytes:
        """The client's events for some chat completion chunks."""

    @abstractmethod
    def stream_end(self, response: dict[str, Any], error: dict[str, Any] | None) -> bytes:
        """The closing events, sent once the call is journaled."""


CHAT_WIRE = Wire()
