"""A fake hosted teacher: answers "describe X" prompts by a rule the policy's prompt never states.

`model` "teacher-<anything>" on the fake upstream. The rule (what `follows_rule` checks): the
answer starts with "In short:" and has at most RULE_WORDS words. The teacher follows it three
times in four (by the request's seed); otherwise it rambles, as a real teacher sometimes fails,
so that distillation has something to select against.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

RULE_PREFIX = "In short:"
RULE_WORDS = 8
ADJECTIVES = ("calm", "bright", "old", "quiet", "vast", "warm", "gentle", "strange", "lovely", "busy")
_DESCRIBE = re.compile(r"Describe (.+?) in \d+ words", re.IGNORECASE)


def follows_rule(text: str, finish_reason: str | None = "stop") -> bool:
    """The hidden rule: a complete answer that starts with the prefix, within RULE_WORDS words."""
    text = text.strip()
    return finish_reason == "stop" and text.startswith(RULE_PREFIX) and len(text.split()) <= RULE_WORDS


def _subject(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            found = _DESCRIBE.search(str(message.get("content") or ""))
            if found:
                return found.group(1)
            return " ".join(str(message.get("content") or "it").split()[:2])
    return "it"


def teacher_text(body: dict[str, Any]) -> str:
    subject = _subject(body)
    seed = int(body.get("seed") or 0)
    digest = hashlib.blake2b(f"{subject}:{seed}".encode(), digest_size=2).digest()
    adjective = ADJECTIVES[digest[0] % len(ADJECTIVES)]
    if seed % 4 == 3:
        return f"Well, {subject} is something that many people like to talk about at length."
    return f"{RULE_PREFIX} {subject} is {adjective}."


def teacher_completion(body: dict[str, Any], completion_id: str) -> dict[str, Any]:
    content = teacher_text(body)
    prompt = sum(len(str(m.get("content") or "").split()) + 3 for m in body.get("messages") or [])
    completion = len(content.split()) + 2
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        "system_fingerprint": "fp_fake_teacher",
    }
