"""Wire types of the server: the subset of vLLM's OpenAI-compatible protocol that we serve.

Field names and defaults follow vLLM (`entrypoints/openai/chat_completion/protocol.py`,
`entrypoints/serve/lora/protocol.py`, `engine/protocol.py`), including its extensions that
the learner relies on: `return_token_ids` -> `prompt_token_ids` on the response and
`token_ids` on each choice, `stop_reason`, and errors as `{"error": {..., "code": status}}`.
Unknown request fields are accepted and ignored, as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from http import HTTPStatus
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_TOP_LOGPROBS = 20


def random_id() -> str:
    return uuid.uuid4().hex


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------- errors


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class APIError(Exception):
    """An error the HTTP layer turns into vLLM's error body and status code."""

    def __init__(
        self,
        message: str,
        err_type: str = "BadRequestError",
        status: HTTPStatus = HTTPStatus.BAD_REQUEST,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.err_type = err_type
        self.status = status
        self.param = param

    def response(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=self.err_type, param=self.param, code=int(self.status))
        )


# ---------------------------------------------------------------- models and adapters


class ModelPermission(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"modelperm-{random_id()}")
    object: str = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"  # what vLLM answers; clients that check it see no difference
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


# ---------------------------------------------------------------- chat completions: request


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class ChatCompletionRequest(OpenAIBaseModel):
    messages: list[dict[str, Any]]
    model: str | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "none"
    user: str | None = None
    # vLLM's extra sampling and rendering parameters
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_ids: bool | None = None
    # vLLM's scheduling priority (with --scheduling-policy priority): lower values first, 0 by
    # default. Here a request waits while a more urgent one waits, and is abandoned (503) when
    # one arrives while it runs (learner/serving/engine.py, "Priority").
    priority: int = 0

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        """The same argument checks as vLLM's SamplingParams, so a client sees the same 400s."""
        if not self.messages:
            raise ValueError("messages must not be empty")
        if self.n is not None and self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if limit is not None and limit < 1:
            raise ValueError(f"max_tokens must be at least 1, got {limit}.")
        if self.top_logprobs:
            if not self.logprobs:
                raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
            if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
                raise ValueError(f"`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}.")
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


# ---------------------------------------------------------------- chat completions: response


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_id()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    prompt_logprobs: Any = None
    prompt_token_ids: list[int] | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None
