"""Rebuild a whole chat completion from the server-sent events of a stream.

The client gets the upstream's bytes untouched; this runs once the stream has ended, to
record the answer as if it had not been streamed: content, tool calls (their argument
fragments joined), logprobs, vLLM's token ids, finish reasons and usage.
"""

from __future__ import annotations

from typing import Any

import orjson


def parse_sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of `data:` lines, `[DONE]` and comments skipped."""
    events: list[dict[str, Any]] = []
    for line in raw.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _merge_tool_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


def assemble_completion(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A `chat.completion` object equivalent to the streamed chunks."""
    completion: dict[str, Any] = {"object": "chat.completion", "choices": []}
    choices: dict[int, dict[str, Any]] = {}
    for event in events:
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if event.get(key) is not None and key not in completion:
                completion[key] = event[key]
        if event.get("usage"):
            completion["usage"] = event["usage"]
        if event.get("prompt_token_ids") is not None:
            completion["prompt_token_ids"] = event["prompt_token_ids"]
        for chunk_choice in event.get("choices") or []:
            index = chunk_choice.get("index", 0)
            choice = choices.setdefault(
                index,
                {
                    "index": index,
                    "message": {"role": "assistant", "content": None},
                    "finish_reason": None,
                    "logprobs": None,
                },
            )
            delta = chunk_choice.get("delta") or {}
            message = choice["message"]
            if delta.get("role"):
                message["role"] = delta["role"]
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            if delta.get("reasoning_content"):
                message["reasoning_content"] = message.get("reasoning_content", "") + delta["reasoning_content"]
            if delta.get("refusal"):
                message["refusal"] = (message.get("refusal") or "") + delta["refusal"]
            for tool_delta in delta.get("tool_calls") or []:
                _merge_tool_call(message.setdefault("tool_calls", []), tool_delta)
            if chunk_choice.get("finish_reason"):
                choice["finish_reason"] = chunk_choice["finish_reason"]
            logprobs = chunk_choice.get("logprobs")
            if logprobs and logprobs.get("content"):
                if choice["logprobs"] is None:
                    choice["logprobs"] = {"content": [], "refusal": None}
                choice["logprobs"]["content"].extend(logprobs["content"])
            if chunk_choice.get("token_ids"):
                choice.setdefault("token_ids", []).extend(chunk_choice["token_ids"])
    completion["choices"] = [choices[i] for i in sorted(choices)]
    return completion
