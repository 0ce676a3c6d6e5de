"""Policies' calls record what training needs: sampled-token logprobs and exact token ids.

Clients rarely ask for them, so for a policy the gateway asks the inference server itself
(`logprobs: true`, vLLM's `return_token_ids: true`), records them, and removes from the answer
whatever the client did not ask for, so the client sees what it would have seen otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

TOKEN_ID_FIELDS = ("token_ids",)
RESPONSE_TOKEN_FIELDS = ("prompt_token_ids", "prompt_logprobs")


@dataclass(slots=True)
class TokenCapture:
    """What was added to a policy call, and so must be stripped from its answer."""

    strip_logprobs: bool
    strip_token_ids: bool

    @property
    def active(self) -> bool:
        return self.strip_logprobs or self.strip_token_ids


def capture_for(body: dict[str, Any]) -> tuple[dict[str, Any], TokenCapture]:
    """Fields to add to a policy call's body, and what to strip from the answer."""
    added: dict[str, Any] = {}
    capture = TokenCapture(strip_logprobs=not body.get("logprobs"), strip_token_ids=not body.get("return_token_ids"))
    if capture.strip_logprobs:
        added["logprobs"] = True
    if capture.strip_token_ids:
        added["return_token_ids"] = True
    return added, capture


def strip_answer(answer: dict[str, Any], capture: TokenCapture) -> dict[str, Any]:
    """A copy of a completion or chunk without the fields the client did not ask for."""
    stripped = dict(answer)
    if capture.strip_token_ids:
        for field in RESPONSE_TOKEN_FIELDS:
            stripped.pop(field, None)
    choices = []
    for choice in answer.get("choices") or []:
        choice = dict(choice)
        if capture.strip_logprobs and "logprobs" in choice:
            choice["logprobs"] = None
        if capture.strip_token_ids:
            for field in TOKEN_ID_FIELDS:
                choice.pop(field, None)
        choices.append(choice)
    if "choices" in answer:
        stripped["choices"] = choices
    return stripped


def event_stripper(capture: TokenCapture) -> Callable[[bytes], bytes]:
    """A rewrite for sse.EventRelay: a stream event without the fields the client did not ask for."""

    def strip_event(event: bytes) -> bytes:
        if event.startswith(b"data:"):
            payload = event[5:].lstrip(b" ")
            if payload.startswith(b"{"):
                try:
                    return b"data: " + orjson.dumps(strip_answer(orjson.loads(payload), capture))
                except orjson.JSONDecodeError:
                    pass
        return event

    return strip_event
