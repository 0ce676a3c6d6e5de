"""The judge's calls: an ordinary OpenAI-compatible client of the gateway itself.

Going through the gateway (not straight to the judge's upstream) is the point: the judge's
calls are authenticated with a gateway key, routed like any call (a hosted model through
litellm, or one of our own endpoints), recorded, counted and billed. They carry the client
trajectory id `apprentice-judge:<judgement>`, by which the judge and the learner leave them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from apprentice.settings import JudgeSettings, Settings, gateway_base_url, resolve_secret

__all__ = ["JudgeCallFailed", "JudgeClient", "JudgeReply", "gateway_base_url"]


class JudgeCallFailed(RuntimeError):
    """The gateway answered the judge's call with an error, or did not answer."""


@dataclass(frozen=True, slots=True)
class JudgeReply:
    content: str | None
    prompt_tokens: int
    completion_tokens: int


class JudgeClient:
    def __init__(self, settings: Settings, judge: JudgeSettings) -> None:
        self.judge = judge
        self.url = gateway_base_url(settings, judge) + "/chat/completions"
        key = resolve_secret(judge.api_key)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.AsyncClient(timeout=judge.timeout_s)

    async def close(self) -> None:
        await self._http.aclose()

    async def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any], trajectory: str
    ) -> JudgeReply:
        body: dict[str, Any] = {
            "model": self.judge.model,
            "messages": messages,
            "response_format": response_format,
            "temperature": self.judge.temperature,
        }
        if self.judge.max_tokens is not None:
            body["max_tokens"] = self.judge.max_tokens
        headers = {**self._headers, "X-Trajectory-Id": trajectory}
        try:
            response = await self._http.post(self.url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise JudgeCallFailed(f"judge call failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise JudgeCallFailed(f"judge call failed with HTTP {response.status_code}: {response.text[:300]}")
        try:
            answer = response.json()
            message = answer["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise JudgeCallFailed(f"judge call answered something that is not a chat completion: {exc}") from exc
        usage = answer.get("usage") or {}
        return JudgeReply(
            content=message.get("content") if isinstance(message, dict) else None,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )
