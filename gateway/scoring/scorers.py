"""The two kinds of reward function: an HTTP endpoint the operator runs, or a Python entry point.

Both receive the same JSON object (`payload`) and give one finite number:

    {"policy": ..., "trajectory_id": ..., "reward_name": ...,
     "messages": [... the last call's messages ..., the answer],   # the whole conversation
     "answer": {"role": "assistant", "content": ..., "tool_calls": ...},
     "finish_reason": "stop" | "length" | "tool_calls" | ...,       # why the answer ended
     "tools": [...] | null,
     "calls": [{"messages": [...], "answer": {...}, "finish_reason": ...}, ...]}  # each call of a run

`finish_reason` is the upstream's, as the client saw it: a scorer tells an answer that ended by
itself ("stop") from one cut at max_tokens ("length"), which no text alone shows.

- HTTP: POSTed as JSON, signed like the reward webhooks when a secret is set
  (`Apprentice-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`, the
  receiver checks it as gateway/rewards/signatures.py does), answered with `{"score": number}`
  within `timeout_s`; any other status or body is a failed attempt.
- Python: `module:function`, imported once, called with the payload; it returns a number (a
  coroutine function is awaited). A plain function runs in a worker thread so the gateway's
  event loop never waits on it; past `timeout_s` its answer is no longer waited for.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from apprentice.settings import RewardFunctionSettings, resolve_secret
from gateway.rewards.signatures import SIGNATURE_HEADER, sign


class ScoringError(RuntimeError):
    """The function gave no usable score this time."""


def _answer(response: dict[str, Any]) -> dict[str, Any]:
    choices = response.get("choices") or []
    message = dict((choices[0].get("message") if choices else None) or {})
    message["role"] = "assistant"
    return {k: v for k, v in message.items() if k in ("role", "content", "tool_calls") and v is not None}


def _finish_reason(response: dict[str, Any]) -> str | None:
    choices = response.get("choices") or []
    reason = choices[0].get("finish_reason") if choices else None
    return reason if isinstance(reason, str) else None


def payload(
    policy: str, name: str, trajectory_id: str, calls: list[tuple[dict[str, Any], dict[str, Any]]]
) -> dict[str, Any]:
    """What a function reads of a trajectory (see the module docstring)."""
    if not calls:
        raise ScoringError("the trajectory has no answered call")
    turns: list[dict[str, Any]] = [
        {
            "messages": list(request.get("messages") or []),
            "answer": _answer(response),
            "finish_reason": _finish_reason(response),
        }
        for request, response in calls
    ]
    last = turns[-1]
    return {
        "policy": policy,
        "trajectory_id": trajectory_id,
        "reward_name": name,
        "messages": [*last["messages"], last["answer"]],
        "answer": last["answer"],
        "finish_reason": last["finish_reason"],
        "tools": calls[0][0].get("tools"),
        "calls": turns,
    }


def _score(value: Any) -> float:
    if isinstance(value, dict):
        value = value.get("score")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ScoringError(f"the function's score must be a finite number, got {value!r}")
    return float(value)


class HttpScorer:
    def __init__(self, function: RewardFunctionSettings) -> None:
        assert function.url is not None
        self.url = function.url
        self.secret = resolve_secret(function.secret)
        self.timeout_s = function.timeout_s
        self.client = httpx.AsyncClient(timeout=function.timeout_s)

    async def __call__(self, body: dict[str, Any]) -> float:
        raw = orjson.dumps(body)
        headers = {"Content-Type": "application/json"}
        if self.secret:
            headers[SIGNATURE_HEADER] = sign(self.secret, raw)
        try:
            response = await self.client.post(self.url, content=raw, headers=headers)
        except httpx.HTTPError as exc:
            raise ScoringError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ScoringError(f"the endpoint answered {response.status_code}: {response.text[:200]}")
        try:
            return _score(response.json())
        except ValueError as exc:
            raise ScoringError(f"the endpoint's answer is not JSON: {response.text[:200]}") from exc

    async def close(self) -> None:
        await self.client.aclose()


class PythonScorer:
    def __init__(self, function: RewardFunctionSettings) -> None:
        assert function.entry_point is not None
        self.function = load_entry_point(function.entry_point)
        self.timeout_s = function.timeout_s

    async def __call__(self, body: dict[str, Any]) -> float:
        try:
            if inspect.iscoroutinefunction(self.function):
                value = await asyncio.wait_for(self.function(body), self.timeout_s)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(self.function, body), self.timeout_s)
        except TimeoutError as exc:
            raise ScoringError(f"no score within {self.timeout_s} s") from exc
        except ScoringError:
            raise
        except Exception as exc:  # the operator's code: any error is this attempt's failure
            raise ScoringError(f"{type(exc).__name__}: {exc}") from exc
        return _score(value)

    async def close(self) -> None:
        return None


def load_entry_point(entry_point: str) -> Callable[..., Any]:
    """`module:function` (a dotted attribute path after the colon) -> the callable."""
    module_name, _, attribute = entry_point.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"reward function entry point {entry_point!r} is not callable")
    return target


def scorer_for(function: RewardFunctionSettings) -> HttpScorer | PythonScorer:
    return HttpScorer(function) if function.url is not None else PythonScorer(function)
