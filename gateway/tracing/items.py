"""What the tracing queue holds: the few fields of a call or a reward that its span needs.

Taken on the hot path (`CallTracer.offer`), so kept to plain lookups: the journal record holds
the whole request and answer, and a queue of 10,000 of those could hold gigabytes; these are a
few hundred bytes each (plus references to the messages when `include_content` is on). The
conversion to OpenTelemetry spans happens later, in the export thread (gateway/tracing/spans.py).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(slots=True)
class CallItem:
    call_id: str
    trajectory_id: str
    client_trajectory_id: str | None
    group_id: str | None
    protocol: str
    tenant: str | None
    model: str | None
    upstream: str | None
    upstream_model: str | None
    policy: str | None
    adapter_version_id: str | None
    created_at: float  # unix seconds
    latency_ms: float
    ttft_ms: float | None
    status_code: int
    error: Any
    stream: bool
    prompt_tokens: int | None
    completion_tokens: int | None
    temperature: float | None
    max_tokens: int | None
    top_p: float | None
    response_id: str | None
    response_model: str | None
    finish_reasons: tuple[str, ...]
    # Only with include_content: the request's messages and the answer, serialized at export.
    input_messages: Any = None
    output: Any = None


@dataclass(slots=True)
class RewardItem:
    reward_id: uuid.UUID
    trajectory_id: uuid.UUID | None  # None while the reward is pending (its trajectory unknown)
    status: str
    name: str
    value: float
    metrics: dict[str, float]
    source: str
    tenant: str
    target_kind: str  # "trajectory" or "call"
    target: str
    group_id: str | None
    received_at: datetime
    comment: str | None = None  # only with include_content


def _number(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def finish_reasons(response: Any) -> tuple[str, ...]:
    """Why the answer ended, per protocol: chat completions' choices, Anthropic's `stop_reason`,
    the Responses API's status (`completed` is `stop`; an incomplete answer gives its reason)."""
    if not isinstance(response, dict):
        return ()
    choices = response.get("choices")
    if isinstance(choices, list):
        return tuple(
            str(choice["finish_reason"])
            for choice in choices
            if isinstance(choice, dict) and choice.get("finish_reason") is not None
        )
    if response.get("stop_reason") is not None:
        return (str(response["stop_reason"]),)
    if response.get("object") == "response":
        status = response.get("status")
        if status == "completed":
            return ("stop",)
        details = response.get("incomplete_details")
        if isinstance(details, dict) and details.get("reason"):
            return (str(details["reason"]),)
        return (str(status),) if status else ()
    return ()


def _output(response: Any) -> Any:
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if isinstance(choices, list):
        return [choice.get("message") for choice in choices if isinstance(choice, dict)]
    return response.get("content", response.get("output"))


def call_item(record: dict[str, Any], include_content: bool) -> CallItem:
    """The span's fields of a journal record (gateway/endpoints/chat_completions/handler.py)."""
    request = record.get("request")
    request = request if isinstance(request, dict) else {}
    response = record.get("response")
    answer = response if isinstance(response, dict) else {}
    max_tokens = request.get("max_tokens", request.get("max_completion_tokens", request.get("max_output_tokens")))
    return CallItem(
        call_id=record["id"],
        trajectory_id=record["trajectory_id"],
        client_trajectory_id=record.get("client_trajectory_id"),
        group_id=record.get("group_id"),
        protocol=record.get("protocol") or "chat.completions",
        tenant=record.get("tenant"),
        model=record.get("model"),
        upstream=record.get("upstream"),
        upstream_model=record.get("upstream_model"),
        policy=record.get("policy"),
        adapter_version_id=record.get("adapter_version_id"),
        created_at=record["created_at"],
        latency_ms=record["latency_ms"],
        ttft_ms=record.get("ttft_ms"),
        status_code=record["status_code"],
        error=record.get("error"),
        stream=bool(record.get("stream")),
        prompt_tokens=_number(record.get("prompt_tokens")),
        completion_tokens=_number(record.get("completion_tokens")),
        temperature=_number(record.get("temperature")),
        max_tokens=_number(max_tokens),
        top_p=_number(request.get("top_p")),
        response_id=record.get("response_id") or answer.get("id"),
        response_model=answer.get("model"),
        finish_reasons=finish_reasons(answer),
        input_messages=request.get("messages", request.get("input")) if include_content else None,
        output=_output(answer) if include_content else None,
    )
