"""Wire types of `POST /v1/messages` and `/v1/messages/count_tokens`, and Anthropic's error body,
for the OpenAPI document.

Permissive on purpose (`extra="allow"`): an upstream that speaks Messages gets the client's
bytes as they are, and the translation (translate.py) names what it maps, drops and refuses
(with the field named, errors.py). The fields typed here are the ones the gateway reads or
answers with. They document; the handler does not validate with them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class AnthropicErrorDetail(BaseModel):
    type: str = Field(
        description="By status (errors.py): `invalid_request_error`, `authentication_error`, `not_found_error`, "
        "`request_too_large`, `rate_limit_error`, `api_error`, `overloaded_error`, `timeout_error`, ..."
    )
    message: str = Field(description="Names the offending field as Anthropic does: `messages.0.role: Field required`.")


class AnthropicError(BaseModel):
    """Anthropic's error format: every answer of these endpoints uses it, the gateway's own errors included."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


class MessageParam(_Open):
    role: Literal["user", "assistant", "system"] = Field(
        description="`user` or `assistant` (`system` is accepted too)."
    )
    content: str | list[dict[str, Any]] = Field(
        description="Text, or content blocks (`text`, `image`, `tool_use`, `tool_result`, `thinking`, ...)."
    )


class CountTokensRequest(_Open):
    """What `count_tokens` counts: a Messages request without `max_tokens` and `stream`."""

    model: str = Field(min_length=1, description="A `model_list` name or a policy (`GET /v1/models`).")
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = Field(None, description="Client tools (a policy runs no server tools).")
    tool_choice: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """Anthropic's Messages request. For a model that does not speak Messages it is translated to
    chat completions (translate.py: `document` blocks, server tools and `mcp_servers` are refused
    with 400; `thinking` blocks and `cache_control` are dropped)."""

    max_tokens: int = Field(ge=1)
    stream: bool | None = Field(None, description="true: answered as server-sent events (`text/event-stream`).")
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = Field(None, description="`metadata.user_id` becomes the chat request's `user`.")


class MessagesUsage(_Open):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class Message(_Open):
    """Anthropic's `message` object."""

    id: str = Field(description="`msg_...`: rewards and the trajectory API accept it.")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]] = Field(description="`text` and `tool_use` blocks.")
    stop_reason: str | None = Field(description="`end_turn`, `max_tokens`, `stop_sequence`, `tool_use`, `refusal`.")
    stop_sequence: str | None = None
    usage: MessagesUsage


class MessageStreamEvent(_Open):
    """The data of one server-sent event (`event: <type>`): `message_start`, `content_block_start`,
    `content_block_delta`, `content_block_stop`, `message_delta` (the usage), `message_stop`;
    or `error` (an `AnthropicError`) when the upstream breaks off mid-stream."""

    type: str


class TokenCount(BaseModel):
    input_tokens: int
