"""Policies' calls record what training needs: sampled-token logprobs and exact token ids.

Clients rarely ask for them, so for a policy the gateway asks the inference server itself
(`logprobs: true`, vLLM's `return_token_ids: true`), records them, and removes from the answer
whatever the client did not ask for, so the client sees what it would have seen otherwise.
"""

from __future__ import annotations

import re
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


# `"usage": null` as upstreams write it into every chunk once the stream's usage is asked for.
_NULL_USAGE = re.compile(rb',\s*"usage"\s*:\s*null|"usage"\s*:\s*null\s*,?')


def _without_usage(payload: bytes) -> bytes | None:
    """A chunk without the usage the client did not ask for: None for the usage-only chunk."""
    if b'"usage"' not in payload:
        return payload
    payload = _NULL_USAGE.sub(b"", payload)
    if b'"usage"' not in payload:
        return payload
    chunk = orjson.loads(payload)
    if isinstance(chunk, dict):
        if not chunk.get("choices"):
            return None
        chunk.pop("usage", None)
    return orjson.dumps(chunk)


def event_stripper(capture: TokenCapture | None, *, strip_usage: bool = False) -> Callable[[bytes], bytes] | None:
    """A rewrite for sse.EventRelay: a stream event without the fields the client did not ask
    for (token ids and logprobs added for a policy; the usage the gateway asked for). None when
    nothing is to be stripped: the events pass untouched."""
    if capture is None and not strip_usage:
        return None

    def strip_event(event: bytes) -> bytes:
        if event.startswith(b"data:"):
            payload = event[5:].lstrip(b" ")
            if payload.startswith(b"{"):
                try:
                    if strip_usage:
                        stripped = _without_usage(payload)
                        if stripped is None:
                            return b""
                        payload = stripped
                    if capture is not None:
                        payload = orjson.dumps(strip_answer(orjson.loads(payload), capture))
                    return b"data: " + payload
                except orjson.JSONDecodeError:
                    pass
        return event

    return strip_event
