"""A message's `content` as plain text, the one reading for whoever shows a conversation.

Chat-completions content is a string, null, or a list of parts; the Responses and Messages
translations add `input_text` / `output_text` parts and refusals. The judge's transcript
(gateway/judging/transcript.py) and the dashboard's conversation (gateway/ui/conversation.py)
both read content through `content_text`, so the judge is shown what the reviewer sees.
"""

from __future__ import annotations

from typing import Any

import orjson


def content_text(content: Any) -> str:
    """Strings as they are; parts joined by newlines (text parts' text, a refusal as
    "[refusal] why", any other part named by its type, e.g. "[image_url]"); null as ""; anything
    else as compact JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(part) for part in content)
    return orjson.dumps(content).decode()


def _part_text(part: Any) -> str:
    if not isinstance(part, dict):
        return str(part)
    if isinstance(part.get("text"), str):
        return str(part["text"])
    if part.get("type") == "refusal":
        return f"[refusal] {part.get('refusal', '')}"
    return f"[{part.get('type', 'part')}]"
