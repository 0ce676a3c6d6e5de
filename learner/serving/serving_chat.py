"""`POST /v1/chat/completions`: render the chat, run the engine, answer as vLLM does.

Mirrors vLLM's `OpenAIServingChat`: the chat template renders the messages (and `tools`,
for templates that use them) to text, which is tokenized without extra special tokens
(learner/chat_template.py: the trainer renders recorded chats the same way); the
answer carries `prompt_token_ids` and per-choice `token_ids` when `return_token_ids` is set,
OpenAI-shaped `logprobs`, `stop_reason`, and streams as SSE chunks ending in `[DONE]`.
Tool calls are not parsed out of the generated text (vLLM needs a `--tool-call-parser` for
that too); the text comes back as the message content.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from learner.chat_template import render_chat_ids
from learner.serving.engine import (
    GenerationEngine,
    RequestAbandoned,
    SequenceUpdate,
    TokenLogprob,
    UnknownAdapterError,
)
from learner.serving.protocol import (
    APIError,
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
    UsageInfo,
    random_id,
)
from learner.serving.sampling import SamplingParams
from learner.serving.serving_models import OpenAIServingModels

log = logging.getLogger(__name__)


@dataclass
class _Choice:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class OpenAIServingChat:
    def __init__(
        self,
        engine: GenerationEngine,
        models: OpenAIServingModels,
        tokenizer: Any,
        max_model_len: int,
        default_max_tokens: int | None = None,
    ) -> None:
        self.engine = engine
        self.models = models
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens

    # ------------------------------------------------------------ request -> engine input

    def render(self, request: ChatCompletionRequest) -> list[int]:
        """The exact prompt token ids: chat template to text, then tokens without added specials."""
        kwargs = dict(request.chat_template_kwargs or {})
        if request.tools:
            kwargs["tools"] = request.tools
        if request.chat_template:
            kwargs["chat_template"] = request.chat_template
        try:
            return render_chat_ids(
                self.tokenizer,
                request.messages,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                **kwargs,
            )
        except Exception as exc:  # template errors are the request's fault (bad roles, ...)
            raise APIError(f"Could not apply the chat template: {exc}") from exc

    def sampling_params(self, request: ChatCompletionRequest, prompt_len: int) -> SamplingParams:
        room = self.max_model_len - prompt_len
        wanted = request.max_new_tokens
        if room <= 0 or (wanted is not None and wanted > room):
            asked = wanted if wanted is not None else 0
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_len + asked} tokens ({prompt_len} in the messages, {asked} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        if wanted is None:
            wanted = room if self.default_max_tokens is None else min(room, self.default_max_tokens)
        return SamplingParams(
            max_tokens=wanted,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            n=request.n or 1,
            seed=request.seed,
            stop=request.stop_strings,
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=request.ignore_eos,
            logprobs=bool(request.logprobs),
            top_logprobs=request.top_logprobs or 0,
            skip_special_tokens=request.skip_special_tokens,
            include_stop_str_in_output=request.include_stop_str_in_output,
        )

    # ------------------------------------------------------------ entry point

    async def create_chat_completion(
        self, request: ChatCompletionRequest
    ) -> ChatCompletionResponse | AsyncIterator[str]:
        adapter = await self.models.check_model(request.model)
        model_name = request.model or self.models.base_name
        prompt_ids = self.render(request)
        params = self.sampling_params(request, len(prompt_ids))
        updates = self.engine.generate(prompt_ids, params, adapter, request.priority)
        if request.stream:
            return self._stream(request, model_name, prompt_ids, params, updates)
        return await self._collect(request, model_name, prompt_ids, params, updates)

    async def _collect(
        self,
        request: ChatCompletionRequest,
        model_name: str,
        prompt_ids: list[int],
        params: SamplingParams,
        updates: AsyncIterator[list[SequenceUpdate]],
    ) -> ChatCompletionResponse:
        choices = [_Choice() for _ in range(params.n)]
        try:
            async for step in updates:
                for update in step:
                    _apply(choices[update.index], update)
        except UnknownAdapterError as exc:  # the adapter was unloaded while the request waited
            raise APIError(
                f"The model `{exc.name}` does not exist.", "NotFoundError", HTTPStatus.NOT_FOUND, param="model"
            ) from exc
        except RequestAbandoned as exc:  # a more urgent request arrived (the `priority` field)
            raise APIError(str(exc), "ServiceUnavailableError", HTTPStatus.SERVICE_UNAVAILABLE) from exc
        return_ids = bool(request.return_token_ids)
        out = [
            ChatCompletionResponseChoice(
                index=i,
                message=ChatMessage(role="assistant", content=c.text),
                logprobs=self._logprobs(c.logprobs, params.top_logprobs) if params.logprobs else None,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                token_ids=c.token_ids if return_ids else None,
            )
            for i, c in enumerate(choices)
        ]
        completion = sum(len(c.token_ids) for c in choices)
        return ChatCompletionResponse(
            model=model_name,
            choices=out,
            usage=UsageInfo(
                prompt_tokens=len(prompt_ids), completion_tokens=completion, total_tokens=len(prompt_ids) + completion
            ),
            prompt_token_ids=prompt_ids if return_ids else None,
        )

    async def _stream(
        self,
        request: ChatCompletionRequest,
        model_name: str,
        prompt_ids: list[int],
        params: SamplingParams,
        updates: AsyncIterator[list[SequenceUpdate]],
    ) -> AsyncIterator[str]:
        chunk_id, created = f"chatcmpl-{random_id()}", int(time.time())
        return_ids = bool(request.return_token_ids)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)

        def chunk(choices: list[ChatCompletionResponseStreamChoice], **extra: Any) -> str:
            body = ChatCompletionStreamResponse(
                id=chunk_id, created=created, model=model_name, choices=choices, **extra
            )
            return f"data: {body.model_dump_json()}\n\n"

        completion = 0
        try:
            for index in range(params.n):
                first = ChatCompletionResponseStreamChoice(
                    index=index, delta=DeltaMessage(role="assistant", content=""), logprobs=None, finish_reason=None
                )
                extra = {"prompt_token_ids": prompt_ids} if return_ids and index == 0 else {}
                yield chunk([first], **extra)
            async for step in updates:
                for update in step:
                    completion += len(update.token_ids)
                    choice = ChatCompletionResponseStreamChoice(
                        index=update.index,
                        delta=DeltaMessage(content=update.text),
                        logprobs=self._logprobs(update.logprobs, params.top_logprobs) if params.logprobs else None,
                        finish_reason=update.finish_reason,
                        stop_reason=update.stop_reason,
                    )
                    if return_ids:
                        choice.token_ids = update.token_ids
                    yield chunk([choice])
            if include_usage:
                yield chunk(
                    [],
                    usage=UsageInfo(
                        prompt_tokens=len(prompt_ids),
                        completion_tokens=completion,
                        total_tokens=len(prompt_ids) + completion,
                    ),
                )
        except UnknownAdapterError as exc:
            error = APIError(f"The model `{exc.name}` does not exist.", "NotFoundError", HTTPStatus.NOT_FOUND)
            yield f"data: {error.response().model_dump_json()}\n\n"
        except RequestAbandoned as exc:
            error = APIError(str(exc), "ServiceUnavailableError", HTTPStatus.SERVICE_UNAVAILABLE)
            yield f"data: {error.response().model_dump_json()}\n\n"
        except Exception as exc:  # the stream has started: report in-band, as vLLM does
            log.exception("stream failed")
            error = APIError(str(exc), "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR)
            yield f"data: {error.response().model_dump_json()}\n\n"
        finally:
            await updates.aclose()  # type: ignore[attr-defined]
        yield "data: [DONE]\n\n"

    # ------------------------------------------------------------ logprobs in OpenAI's shape

    def _token(self, token_id: int) -> ChatCompletionLogProb:
        text = self.tokenizer.decode([token_id])
        return ChatCompletionLogProb(token=text, bytes=list(text.encode("utf-8")))

    def _logprobs(self, entries: list[TokenLogprob], k: int) -> ChatCompletionLogProbs:
        content = []
        for entry in entries:
            token = self._token(entry.token_id)
            top = []
            for tid, lp in entry.top[:k]:
                alt = self._token(tid)
                alt.logprob = max(lp, -9999.0)
                top.append(alt)
            content.append(
                ChatCompletionLogProbsContent(
                    token=token.token, bytes=token.bytes, logprob=max(entry.logprob, -9999.0), top_logprobs=top
                )
            )
        return ChatCompletionLogProbs(content=content)


def _apply(choice: _Choice, update: SequenceUpdate) -> None:
    choice.token_ids += update.token_ids
    choice.text += update.text
    choice.logprobs += update.logprobs
    if update.finish_reason is not None:
        choice.finish_reason, choice.stop_reason = update.finish_reason, update.stop_reason
