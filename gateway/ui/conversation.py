"""A trajectory's calls as the conversation they were: messages, tool calls and tool results.

Every call is stored in chat-completions form (`calls.request` / `calls.response`, translated
calls included). A run's later call repeats the earlier messages and answer, so each call adds
only what follows what was already shown; a call that does not continue the conversation so far
(a client-named trajectory of independent calls) starts a new context. Text is returned as
text: the templates escape it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.trajectories.content import content_text


@dataclass
class ToolCall:
    id: str | None
    name: str
    arguments: str


@dataclass
class Turn:
    role: str  # system | developer | user | assistant | tool | error
    text: str
    call_index: int  # which call (0-based) first showed it
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    new_context: bool = False  # the first turn of a call that did not continue the conversation


def _tool_calls(message: dict[str, Any]) -> list[ToolCall]:
    calls = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        function = call.get("function") or {}
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                id=call.get("id"),
                name=str(function.get("name") or call.get("type") or "tool"),
                arguments=arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode(),
            )
        )
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        calls.append(ToolCall(None, str(legacy.get("name") or "function"), str(legacy.get("arguments") or "")))
    return calls


def _key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two messages the same turn (clients echo answers with small differences)."""
    calls = tuple((c.name, c.arguments) for c in _tool_calls(message))
    return (message.get("role"), content_text(message.get("content")).strip(), calls, message.get("tool_call_id"))


def _turn(message: dict[str, Any], index: int) -> Turn:
    return Turn(
        role=str(message.get("role") or "unknown"),
        text=content_text(message.get("content")),
        call_index=index,
        name=message.get("name") if isinstance(message.get("name"), str) else None,
        tool_call_id=message.get("tool_call_id"),
        tool_calls=_tool_calls(message),
    )


def _answer(response: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(response, dict):
        return None
    choices = response.get("choices") or []
    if choices and isinstance(choices[0], dict) and isinstance(choices[0].get("message"), dict):
        message: dict[str, Any] = choices[0]["message"]
        return message
    return None


def conversation(calls: list[tuple[dict[str, Any], dict[str, Any] | None, Any]]) -> list[Turn]:
    """Turns of (request, response, error) per call, oldest call first."""
    turns: list[Turn] = []
    shown: list[tuple[Any, ...]] = []
    for index, (request, response, error) in enumerate(calls):
        messages = [m for m in (request.get("messages") or []) if isinstance(m, dict)]
        keys = [_key(m) for m in messages]
        if shown and keys[: len(shown)] == shown:
            new = messages[len(shown) :]
            fresh = False
        else:
            new, fresh = messages, bool(turns)
        for position, message in enumerate(new):
            turn = _turn(message, index)
            turn.new_context = fresh and position == 0
            turns.append(turn)
        shown = keys
        answer = _answer(response)
        if answer is not None:
            turns.append(_turn({**answer, "role": answer.get("role") or "assistant"}, index))
            shown = [*keys, _key(answer)]
        elif error is not None:
            detail = error if isinstance(error, str) else orjson.dumps(error).decode()
            turns.append(Turn(role="error", text=detail, call_index=index))
    return turns
