"""Wire types of `POST /v1/responses` and its read-back routes, for the OpenAPI document.

Permissive on purpose (`extra="allow"`): an upstream that speaks the Responses API gets the
client's bytes as they are, and the translation (translate.py) names what it accepts, drops
and refuses. The fields typed here are the ones the gateway reads or answers with. They
document; the handler does not validate with them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.endpoints.responses.translate import MAX_TOP_LOGPROBS


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponsesRequest(_Open):
    """OpenAI's Responses request. For a policy it is translated to chat completions
    (translate.py says how each field maps; `background: true`, `conversation`, `prompt`,
    built-in tools and file inputs are refused with 400)."""

    model: str = Field(min_length=1, description="A `model_list` name or a policy (`GET /v1/models`).")
    input: str | list[dict[str, Any]] | None = Field(
        None, description="Text, or input items (`message`, `function_call`, `function_call_output`, ...)."
    )
    instructions: str | None = None
    previous_response_id: str | None = Field(
        None,
        description="Continues that response: its conversation is prepended (from the gateway's record when the "
        "model is translated) and the call joins its trajectory.",
    )
    stream: bool | None = Field(None, description="true: answered as server-sent events (`text/event-stream`).")
    tools: list[dict[str, Any]] | None = Field(None, description="Function tools (a policy runs no built-in tools).")
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = Field(None, description="`text.format`: `json_schema` or `json_object` output.")
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # the translator's bound (OpenAI's)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    user: str | None = None


class ResponseUsage(_Open):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, Any] | None = None
    output_tokens_details: dict[str, Any] | None = None


class ResponseObject(_Open):
    """A `response` object: the output items, the status, and the request's settings echoed."""

    id: str = Field(description="`resp_...`: `previous_response_id`, rewards and `GET /v1/responses/{id}` take it.")
    object: Literal["response"] = "response"
    created_at: float
    status: str = Field(description="`completed`, `incomplete`, `failed`, ...")
    model: str
    output: list[dict[str, Any]] = Field(description="`reasoning`, `message` and `function_call` items.")
    usage: ResponseUsage | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    metadata: dict[str, Any] | None = None


class ResponseStreamEvent(_Open):
    """The data of one server-sent event (`event: <type>`): `response.created`, ...,
    `response.output_text.delta`, ..., and last `response.completed` (or `response.incomplete`,
    `response.failed`) carrying the whole response. No `data: [DONE]`."""

    type: str
    sequence_number: int
    response: ResponseObject | None = Field(None, description="On `response.created`, `response.completed`, ...")


class InputItemList(BaseModel):
    """`GET /v1/responses/{id}/input_items`: a page of the input items of a response."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
