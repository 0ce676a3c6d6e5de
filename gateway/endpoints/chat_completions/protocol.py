"""Wire types of `POST /v1/chat/completions`, and OpenAI's error body, for the OpenAPI document.

The handler (handler.py, request.py) reads requests with orjson and checks only what it needs
to route and record a call: every field OpenAI allows, and fields it does not know yet, reach
the upstream untouched. These models say the same thing: permissive (`extra="allow"`), with
the fields the gateway reads or the client most needs typed. They document; nothing
validates a request with them (the hot path stays free of that cost).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Required, TypedDict

from gateway.endpoints.responses.translate import MAX_TOP_LOGPROBS

# The seeds the document declares: |seed| <= 2**63 - 1024, the largest double below 2**63. The
# document writes bounds as doubles, and fuzzers draw and write seeds as doubles too: 2**63 - 1
# came out as 2**63 (schemathesis seed 306907011 sent 9223372036854776000 as valid), and seed
# 1379147953 sent -2**63 as -9223372036854776000 and -(2**63 - 1024) as -9223372036854775000,
# 192 and 216 past them as exact integers. So a seed is within bounds when its nearest double is: the comparison is
# made in doubles (as tests/support/fake_upstream.py, playing OpenAI, makes it), and no 64-bit
# integer's rounding can carry it past 2**63.
SEED_BOUND = 2**63 - 1024


class _Open(BaseModel):
    """A wire object that may carry fields not named here."""

    model_config = ConfigDict(extra="allow")


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(description="`invalid_request_error`, `authentication_error`, `not_found_error`, ...")
    param: str | None = Field(None, description="The request field at fault, when one is.")
    code: str | None = Field(None, description="A stable code: `model_not_found`, `invalid_api_key`, ...")


class OpenAIError(BaseModel):
    """OpenAI's error format (gateway/http/errors.py): the official SDKs raise typed exceptions on it."""

    error: OpenAIErrorDetail


class ChatContentPart(TypedDict, total=False):
    """One part of a message's content: `text`, `image_url`, `input_audio`, `file`, ... Its fields
    may be left out, but one that is sent has OpenAI's type (a `text` that is not a string is a 400)."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]
    type: str
    text: Annotated[str, Field(description="The text of a `text` part.")]


class ChatToolFunction(TypedDict, total=False):
    """A function tool's declaration (`parameters`, `description`, `strict`, ...)."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]
    name: Required[str]


class ChatTool(TypedDict, total=False):
    """A tool the model may call: `{"type": "function", "function": {...}}`, or another type's own fields."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]
    type: str
    function: ChatToolFunction


class ChatMessage(_Open):
    role: str = Field(description="`system`, `developer`, `user`, `assistant` or `tool`.")
    content: str | list[ChatContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_Open):
    """OpenAI's chat completion request; any other field is forwarded as it is."""

    model: str = Field(min_length=1, description="A `model_list` name or a policy (`GET /v1/models`).")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = Field(None, description="true: answered as server-sent events (`text/event-stream`).")
    stream_options: dict[str, Any] | None = Field(
        None,
        description="A streamed call is always recorded with its usage: the gateway asks the upstream for it and "
        "removes the usage chunk from what a client that did not ask for it (`include_usage`) sees.",
    )
    metadata: dict[str, Any] | None = Field(
        None,
        description="`metadata.trajectory_id`, `metadata.group_id` and `metadata.task_family` name the run, its "
        "task group and its task family like the `X-Trajectory-Id`, `X-Group-Id` and `X-Task-Family` headers; the "
        "gateway removes them before forwarding.",
    )
    temperature: float | None = Field(None, description="A policy's own `temperature` overrides it.")
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    # OpenAI's bounds, declared as OpenAI declares them; forwarded unread, so the upstream is the
    # one that refuses a value outside them (OpenAI with a 400, which the gateway relays).
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    n: int | None = Field(None, ge=1, le=128)
    # A 64-bit integer, as OpenAI declares it (SEED_BOUND says which). Seeds are forwarded unread:
    # the few outside the declared bounds still reach the upstream, which refuses a larger one.
    seed: int | None = Field(None, ge=-SEED_BOUND, le=SEED_BOUND)
    stop: str | list[str] | None = None


class ChatUsage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatChoice(_Open):
    index: int
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(_Open):
    """The upstream's answer, as it gave it (a policy's token-capture fields removed)."""

    id: str = Field(description="`chatcmpl-...`: rewards and the trajectory API accept it.")
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage | None = None


class ChatChunkChoice(_Open):
    index: int
    delta: dict[str, Any] = Field(description="`role`, `content`, `tool_calls` fragments, ...")
    finish_reason: str | None = None


class ChatCompletionChunk(_Open):
    """The data of one server-sent event of a streamed answer; the stream ends with `data: [DONE]`.
    A failure after the stream started arrives as a last `data:` event holding an `OpenAIError`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: ChatUsage | None = Field(None, description="On the last chunk (`choices: []`) when usage was asked for.")
