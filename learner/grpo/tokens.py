"""Recorded calls -> token sequences with loss masks and behaviour logprobs.

Training must see exactly what the sampler saw. Two paths, per call:
- Exact ids (preferred): the inference server returned `prompt_token_ids` and each choice's
  `token_ids` (vLLM's `return_token_ids`; the gateway asks for them on policies' calls), and
  `logprobs.content[].logprob` of every sampled token. Nothing is re-tokenized, so nothing is
  lost: re-tokenizing decoded text is not lossless (a word may come back as other tokens).
- Chat template: the call's messages are rendered with the model's template, with and without
  the answer, and the difference is the answer's tokens. This requires the template to be
  prefix-preserving for that turn (rendering `chat[:i]` with the generation prompt must be a
  token prefix of rendering `chat[:i+1]`); a template that is not is refused, never guessed.
  Behaviour logprobs are then unknown and the trainer recomputes them with the adapter version
  that served the call.

A multi-turn trajectory is one call per assistant turn. Consecutive calls are merged into one
sequence when the next call's prompt starts with the previous prompt plus its answer (as token
ids) and they were sampled alike (same temperature and adapter version): the loss then covers
every assistant turn, tool calls included, and nothing else (prompts, tool results, user
turns). When a later prompt does not extend the earlier one (templates that rewrite history,
e.g. drop earlier reasoning), the calls stay separate sequences, each conditioned on exactly
the context the model saw when it produced that turn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from learner.chat_template import render_chat_ids

NAN = float("nan")


class TokenizationError(ValueError):
    """This trajectory cannot be turned into training tokens faithfully; it is left out."""


class TemplateNotPrefixPreserving(TokenizationError):
    """Rendering the chat with the answer does not extend rendering it without."""


@dataclass(slots=True)
class CallTokens:
    """One call's prompt and answer as token ids, with what is known about how it was sampled."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None  # one per completion token, or None: recompute
    temperature: float
    version: str | None  # the adapter version that served it; None: the base model


@dataclass(slots=True)
class Segment:
    """A token sequence to train on: loss on `loss_mask` positions only."""

    input_ids: list[int]
    loss_mask: list[bool]
    # Per position: the sampler's logprob of that token (NaN off the mask); None: not recorded.
    behaviour_logprobs: list[float] | None
    temperature: float
    version: str | None

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(slots=True)
class CallRecord:
    """The parts of a recorded call that training uses (parsed from the calls row)."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None
    answer: dict[str, Any]  # the assistant message of the choice that continued the run
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    temperature: float = 1.0
    version: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def has_token_ids(self) -> bool:
        return bool(self.prompt_ids) and bool(self.completion_ids)


# ------------------------------------------------------------------ parsing recorded calls


def _answer_message(choice: dict[str, Any]) -> dict[str, Any]:
    message = dict(choice.get("message") or {})
    message["role"] = "assistant"
    return message


def _same_answer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a.get("content") or "") == (b.get("content") or "") and [
        c.get("function") for c in a.get("tool_calls") or []
    ] == [c.get("function") for c in b.get("tool_calls") or []]


def pick_choice(response: dict[str, Any], next_messages: Sequence[dict[str, Any]] | None, position: int) -> int:
    """The choice the run continued with: the one the next call echoes back, else the first."""
    choices = response.get("choices") or []
    if len(choices) > 1 and next_messages is not None and position < len(next_messages):
        echoed = next_messages[position]
        for index, choice in enumerate(choices):
            if _same_answer(_answer_message(choice), echoed):
                return index
    return 0


def parse_call(
    request: dict[str, Any],
    response: dict[str, Any],
    temperature: float | None,
    version: str | None,
    next_request: dict[str, Any] | None = None,
) -> CallRecord:
    """A calls row (request and response JSON) as a CallRecord; raises if it holds no answer."""
    choices = response.get("choices") or []
    if not choices:
        raise TokenizationError("the call's response holds no choices")
    messages = list(request.get("messages") or [])
    index = pick_choice(response, (next_request or {}).get("messages"), len(messages))
    choice = choices[index]
    completion_ids = choice.get("token_ids")
    prompt_ids = response.get("prompt_token_ids")
    logprobs = None
    content = (choice.get("logprobs") or {}).get("content")
    if completion_ids and content and len(content) == len(completion_ids):
        values = [entry.get("logprob") for entry in content]
        if all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            logprobs = [float(v) for v in values]
    return CallRecord(
        messages=messages,
        tools=request.get("tools"),
        answer=_answer_message(choice),
        prompt_ids=list(prompt_ids) if prompt_ids else None,
        completion_ids=list(completion_ids) if completion_ids else None,
        logprobs=logprobs,
        temperature=1.0 if temperature is None else float(temperature),
        version=version,
        chat_template_kwargs=dict(request.get("chat_template_kwargs") or {}),
    )


# ------------------------------------------------------------------ the two paths


def exact_call_tokens(call: CallRecord) -> CallTokens:
    """The exact-ids path: what the server returned, untouched."""
    if not call.has_token_ids:
        raise TokenizationError("the call has no recorded token ids")
    return CallTokens(
        list(call.prompt_ids or []), list(call.completion_ids or []), call.logprobs, call.temperature, call.version
    )


def _render_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool, kwargs: dict[str, Any]
) -> list[int]:
    """The call's chat rendered exactly as the server rendered it (see learner/chat_template.py)."""
    options = dict(kwargs)
    if tools:
        options["tools"] = tools
    return render_chat_ids(tokenizer, messages, add_generation_prompt=generation_prompt, **options)


def end_of_turn_ids(tokenizer: Any) -> set[int]:
    """Tokens that end an assistant turn when the model samples: the EOS token(s)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def template_call_tokens(tokenizer: Any, call: CallRecord, end_ids: set[int] | None = None) -> CallTokens:
    """The chat-template path: the answer's tokens are rendering(with answer) - rendering(without).

    The template adds text after the end-of-turn token (ChatML: a newline) that the model never
    sampled; the answer is cut after its last end-of-turn token so that only sampled tokens count.
    """
    end_ids = end_of_turn_ids(tokenizer) if end_ids is None else end_ids
    prompt = _render_ids(tokenizer, call.messages, call.tools, True, call.chat_template_kwargs)
    full = _render_ids(tokenizer, [*call.messages, call.answer], call.tools, False, call.chat_template_kwargs)
    if full[: len(prompt)] != prompt:
        raise TemplateNotPrefixPreserving(
            "the chat template is not prefix-preserving: rendering the chat with the generation prompt is not "
            "a token prefix of rendering it with the answer"
        )
    completion = full[len(prompt) :]
    ends = [i for i, token in enumerate(completion) if token in end_ids]
    if ends:
        completion = completion[: ends[-1] + 1]
    if not completion:
        raise TokenizationError("the answer renders to no tokens")
    return CallTokens(prompt, completion, None, call.temperature, call.version)


def call_tokens(tokenizer: Any, call: CallRecord) -> CallTokens:
    """Exact ids when recorded, else the chat template."""
    if call.has_token_ids:
        return exact_call_tokens(call)
    if tokenizer is None:
        raise TokenizationError("no recorded token ids and no tokenizer to render the chat")
    return template_call_tokens(tokenizer, call)


# ------------------------------------------------------------------ calls -> segments


def _new_segment(call: CallTokens) -> Segment:
    ids = call.prompt_ids + call.completion_ids
    mask = [False] * len(call.prompt_ids) + [True] * len(call.completion_ids)
    behaviour = None
    if call.logprobs is not None:
        behaviour = [NAN] * len(call.prompt_ids) + list(call.logprobs)
    return Segment(ids, mask, behaviour, call.temperature, call.version)


def _extends(segment: Segment, call: CallTokens) -> bool:
    n = len(segment.input_ids)
    return (
        call.temperature == segment.temperature
        and call.version == segment.version
        and len(call.prompt_ids) >= n
        and call.prompt_ids[:n] == segment.input_ids
        and (segment.behaviour_logprobs is None) == (call.logprobs is None)
    )


def _append(segment: Segment, call: CallTokens) -> None:
    tail = call.prompt_ids[len(segment.input_ids) :]
    segment.input_ids += tail + call.completion_ids
    segment.loss_mask += [False] * len(tail) + [True] * len(call.completion_ids)
    if segment.behaviour_logprobs is not None and call.logprobs is not None:
        segment.behaviour_logprobs += [NAN] * len(tail) + list(call.logprobs)


def merge_calls(calls: Sequence[CallTokens]) -> list[Segment]:
    """Consecutive calls of one run -> as few sequences as the prefix property allows."""
    segments: list[Segment] = []
    for call in calls:
        if segments and _extends(segments[-1], call):
            _append(segments[-1], call)
        else:
            segments.append(_new_segment(call))
    return segments


def trajectory_segments(tokenizer: Any, calls: Sequence[CallRecord]) -> list[Segment]:
    """A trajectory's calls (in order) -> segments whose masks cover every assistant turn."""
    if not calls:
        raise TokenizationError("the trajectory has no answered calls")
    return merge_calls([call_tokens(tokenizer, call) for call in calls])
