"""A group's trajectories as the judge reads them: one conversation each, the shared prefix once.

A trajectory is rebuilt from its recorded calls in order: each call's request messages extend
the conversation where they differ from what was seen (an agent resends the history with every
call), and each answer is appended as the assistant turn it was (text and tool calls). Tool
results arrive as `tool` messages of the next request, so they appear where they happened.

The attempts of one group share their beginning (system prompt, task, often tool schemas):
RULER's observation is that a judge reads that once, which both saves tokens and makes the
differences stand out. `split_shared_prefix` takes the longest run of equal leading messages,
but never all of a trajectory: each keeps at least its last message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.trajectories.content import content_text

# One message as the judge sees it: its role and the text shown (a tuple, so equal messages compare equal).
Message = tuple[str, str]

CONTENT_MAX_CHARS = 20_000


@dataclass(frozen=True, slots=True)
class Transcript:
    label: str  # how the prompt names the trajectory ("t1", ...): short, so small judges copy it right
    trajectory_id: str
    messages: list[Message]


def _tool_calls(calls: Any) -> list[str]:
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append(f"call {function.get('name')}({function.get('arguments', '')})")
    return out


def normalise(message: Any) -> Message:
    """One chat message -> (role, shown text), tool calls and tool results spelled out."""
    if not isinstance(message, dict):
        return ("unknown", content_text(message))
    role = str(message.get("role", "unknown"))
    text = content_text(message.get("content"))
    if role == "tool":
        role = f"tool result{' ' + str(message['name']) if message.get('name') else ''}"
    calls = _tool_calls(message.get("tool_calls"))
    if calls:
        text = "\n".join([text, *calls]) if text else "\n".join(calls)
    if len(text) > CONTENT_MAX_CHARS:
        text = text[:CONTENT_MAX_CHARS] + f"... [{len(text) - CONTENT_MAX_CHARS} characters cut]"
    return (role, text)


def _answer(response: Any) -> Message | None:
    choices = response.get("choices") if isinstance(response, dict) else None
    if not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return normalise({"role": "assistant", **message}) if isinstance(message, dict) else None


def _tools(request: dict[str, Any]) -> Message | None:
    tools = request.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    lines = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict):
            parameters = json.dumps(function.get("parameters", {}), ensure_ascii=False, sort_keys=True)
            lines.append(f"{function.get('name')}: {function.get('description', '')} parameters {parameters}")
    return ("tools available", "\n".join(lines)) if lines else None


def conversation(calls: Sequence[tuple[dict[str, Any], dict[str, Any] | None]]) -> list[Message]:
    """The conversation of one trajectory from its (request, response) pairs in call order."""
    shown: list[Message] = []
    for index, (request, response) in enumerate(calls):
        messages = [normalise(m) for m in request.get("messages") or []]
        if index == 0 and (tools := _tools(request)) is not None:
            shown.append(tools)
            offset = 1
        else:
            offset = 1 if shown and shown[0][0] == "tools available" else 0
        seen = shown[offset:]
        common = 0
        while common < min(len(seen), len(messages)) and seen[common] == messages[common]:
            common += 1
        shown.extend(messages[common:])
        if (answer := _answer(response)) is not None:
            shown.append(answer)
    return shown


def split_shared_prefix(transcripts: Sequence[Transcript]) -> tuple[list[Message], list[Transcript]]:
    """(the messages every transcript starts with, the transcripts without them)."""
    if not transcripts:
        return [], []
    shortest = min(len(t.messages) for t in transcripts)
    common = 0
    while common < shortest - 1 and all(t.messages[common] == transcripts[0].messages[common] for t in transcripts):
        common += 1
    shared = transcripts[0].messages[:common]
    return shared, [Transcript(t.label, t.trajectory_id, t.messages[common:]) for t in transcripts]


def render_messages(messages: Sequence[Message]) -> str:
    return "\n".join(f"[{role}]\n{text}" for role, text in messages)


def judge_prompt(rubric: str, transcripts: Sequence[Transcript]) -> list[dict[str, str]]:
    """The judge's messages: the rubric and answer format, then the shared context once and each attempt."""
    shared, rest = split_shared_prefix(transcripts)
    labels = ", ".join(t.label for t in rest)
    system = (
        f"{rubric}\n\n"
        f"There are {len(rest)} attempts, with ids {labels}. They share the context shown once at the top; "
        "each attempt continues from it. Reply with JSON only, in this form:\n"
        '{"scores": [{"trajectory_id": "<id>", "explanation": "<one or two sentences>", "score": <0 to 1>}, ...]}\n'
        "with exactly one entry for every id."
    )
    sections = []
    if shared:
        sections.append(f"<shared_context>\n{render_messages(shared)}\n</shared_context>")
    for transcript in rest:
        sections.append(f'<attempt id="{transcript.label}">\n{render_messages(transcript.messages)}\n</attempt>')
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(sections)}]
