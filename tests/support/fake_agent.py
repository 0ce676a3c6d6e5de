"""A scripted tool-using model for the fake upstream: `model` "agent-..." on /v1/chat/completions.

The tiny local model cannot follow tools, so the examples' agents (examples/*) are tested
against this script, which behaves as a tool-using model does, deterministically:

- in each user turn it calls every offered tool once, in the order offered, one call per
  answer, with arguments that satisfy the tool's JSON schema, taken from the user's message:
  the k-th string parameter gets its k-th name (words mixing letters and digits, such as
  `SKU-42`, then capitalised words after the first), the k-th number its k-th number;
- once every tool has answered in this turn it answers in text that quotes the tool results.

No token ids and no logprobs are returned (as a hosted endpoint without vLLM's
`return_token_ids`): the learner then renders the recorded chat with the model's template.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

FINAL_PREFIX = "Here is what I found:"


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def _this_turn(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The last user message's text and the messages after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return _text(messages[index].get("content")), messages[index + 1 :]
    return "", messages


def _tool_name(tool: dict[str, Any]) -> str:
    return str((tool.get("function") or tool).get("name", "tool"))


def _argument_values(schema: dict[str, Any], user_text: str) -> dict[str, Any]:
    words = re.findall(r"[A-Za-z0-9][\w-]*", user_text)
    mixed = [w for w in words if any(c.isdigit() for c in w) and any(c.isalpha() for c in w)]
    named = mixed + [w for i, w in enumerate(words) if i > 0 and w[0].isupper() and w not in mixed]
    named = named or words[-1:] or ["unknown"]
    numbers = [float(n) for n in re.findall(r"(?<![\w-])\d+(?:\.\d+)?(?![\w-])", user_text)] or [2.0]
    values: dict[str, Any] = {}
    strings = numbers_used = 0
    for name, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if isinstance(spec, dict) and spec.get("enum"):
            values[name] = spec["enum"][0]
        elif kind in ("integer", "number"):
            number = numbers[numbers_used % len(numbers)]
            values[name] = int(number) if kind == "integer" else number
            numbers_used += 1
        elif kind == "boolean":
            values[name] = True
        else:
            values[name] = named[strings % len(named)]
            strings += 1
    return values


def agent_message(body: dict[str, Any], counter: int) -> dict[str, Any]:
    """The assistant message the script answers `body` with: the next tool call, or the final text."""
    user_text, turn = _this_turn(list(body.get("messages") or []))
    called = {
        call.get("function", {}).get("name")
        for message in turn
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
    }
    for tool in body.get("tools") or []:
        name = _tool_name(tool)
        if name in called:
            continue
        schema = (tool.get("function") or tool).get("parameters") or {}
        arguments = orjson.dumps(_argument_values(schema, user_text)).decode()
        call = {"id": f"call_agent{counter}", "type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    results = [_text(m.get("content")) for m in turn if m.get("role") == "tool"]
    text = f"{FINAL_PREFIX} {'; '.join(results)}" if results else f"{FINAL_PREFIX} nothing to look up for {user_text!r}"
    return {"role": "assistant", "content": text}
