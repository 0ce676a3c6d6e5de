"""Posting rewards to the gateway (`POST /v1/rewards`, docs/rewards.md): typed, idempotent, retried, signed.

Every reward carries an idempotency key (your own, or one drawn when the `Reward` is made), so
that the retries of `retry.py` and a sender's own resends never store it twice. A batch is
stored all together or not at all by the gateway; its items keep their own keys, so resending
a whole batch after a lost answer is safe too.

Authenticate with a gateway key (`api_key`, sent as a bearer token) or, for systems that hold
no key, sign each attempt with a webhook secret the gateway is configured with
(`webhook_secret`, see signing.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from apprentice_client.retry import RetryPolicy
from apprentice_client.runs import Run
from apprentice_client.signing import SIGNATURE_HEADER, signature

REPLAYED_HEADER = "Idempotent-Replayed"
TARGETS = ("trajectory_id", "client_trajectory_id", "call_id")


def new_idempotency_key() -> str:
    return f"rwd-{uuid.uuid4().hex}"


def _finite(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number")
    return float(value)


@dataclass(frozen=True)
class Reward:
    """One reward. Name its target with exactly one of `trajectory_id` (the gateway's id),
    `client_trajectory_id` (your run's id) or `call_id` (`chatcmpl-...`, `resp_...`, `msg_...`)."""

    reward: float
    trajectory_id: str | None = None
    client_trajectory_id: str | None = None
    call_id: str | None = None
    name: str | None = None  # None: the gateway's default, "reward" (what the learner trains on)
    metrics: Mapping[str, float] | None = None
    comment: str | None = None
    group_id: str | None = None
    timestamp: datetime | float | None = None  # when the outcome was observed
    idempotency_key: str = field(default_factory=new_idempotency_key)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reward", _finite(self.reward, "reward"))
        given = [name for name in TARGETS if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(f"name exactly one target of {', '.join(TARGETS)} (got {given or 'none'})")
        for key, value in (self.metrics or {}).items():
            _finite(value, f"metrics[{key!r}]")
        if not self.idempotency_key:
            raise ValueError("idempotency_key must not be empty")

    @classmethod
    def for_run(cls, run: Run, reward: float, **fields: Any) -> Reward:
        """A reward for a run made with `run(...)`: its trajectory id, and its group unless given."""
        fields.setdefault("group_id", run.group_id)
        return cls(reward=reward, client_trajectory_id=run.trajectory_id, **fields)

    def to_json(self) -> dict[str, Any]:
        """The reward as the gateway's `RewardIn` body (unset fields left out)."""
        body: dict[str, Any] = {"reward": self.reward, "idempotency_key": self.idempotency_key}
        for name in (*TARGETS, "name", "comment", "group_id"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        if self.metrics:
            body["metrics"] = {key: float(value) for key, value in self.metrics.items()}
        if isinstance(self.timestamp, datetime):
            body["timestamp"] = self.timestamp.isoformat()
        elif self.timestamp is not None:
            body["timestamp"] = _finite(self.timestamp, "timestamp")
        return body


@dataclass(frozen=True)
class StoredReward:
    """The gateway's answer for one reward (`RewardOut`)."""

    id: str
    status: str  # "linked", "pending" (its trajectory is not stored yet) or "rejected"
    current: bool
    trajectory_id: str | None
    name: str
    reward: float
    idempotency_key: str | None
    replayed: bool  # the request was answered from rewards stored earlier under the same keys
    raw: dict[str, Any]

    @classmethod
    def of(cls, item: dict[str, Any], replayed: bool) -> StoredReward:
        return cls(
            id=item["id"],
            status=item["status"],
            current=item["current"],
            trajectory_id=item.get("trajectory_id"),
            name=item["name"],
            reward=item["reward"],
            idempotency_key=item.get("idempotency_key"),
            replayed=replayed,
            raw=item,
        )


class RewardError(Exception):
    """The gateway refused the rewards, or gave no answer within the retry policy."""

    def __init__(
        self, message: str, *, status: int | None = None, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param


@dataclass(frozen=True)
class Attempt:
    """What one attempt sent and got: handed to `on_attempt` (logging, metrics, tests)."""

    number: int
    status: int | None  # None: no answer (connection error, timeout)
    error: str | None
    delay_s: float | None  # the wait before the next attempt; None: no next attempt


OnAttempt = Callable[[Attempt], object]


def _rewards_url(base_url: str) -> str:
    """`.../v1/rewards` from the gateway's root or its `/v1` base (OPENAI_BASE_URL's form)."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/rewards"


def _refusal(response: httpx.Response) -> RewardError:
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    message = error.get("message") or response.text[:500] or response.reason_phrase
    return RewardError(
        f"the gateway refused the rewards ({response.status_code}): {message}",
        status=response.status_code,
        code=error.get("code"),
        param=error.get("param"),
    )


class _Sender:
    """What the sync and async clients share: the body, each attempt's headers, the answer."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        webhook_secret: str | None,
        retry: RetryPolicy,
        on_attempt: OnAttempt | None,
    ) -> None:
        base_url = base_url or os.environ.get("APPRENTICE_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise ValueError("give base_url (or set APPRENTICE_BASE_URL / OPENAI_BASE_URL)")
        if webhook_secret is None and api_key is None:
            api_key = os.environ.get("APPRENTICE_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.url = _rewards_url(base_url)
        self.api_key = api_key
        self.webhook_secret = webhook_secret
        self.retry = retry
        self.on_attempt = on_attempt

    @staticmethod
    def body(rewards: Sequence[Reward], batch: bool) -> bytes:
        if not rewards:
            raise ValueError("no rewards to post")
        payload: Any = {"rewards": [r.to_json() for r in rewards]} if batch else rewards[0].to_json()
        return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()

    def headers(self, body: bytes) -> dict[str, str]:
        """Headers of one attempt: a signed webhook is signed anew each time (a new `t`)."""
        headers = {"Content-Type": "application/json"}
        if self.webhook_secret is not None:
            headers[SIGNATURE_HEADER] = signature(self.webhook_secret, body)
        elif self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def next_delay(self, attempt: int, response: httpx.Response | None, error: Exception | None) -> float | None:
        """None when this attempt's outcome is final, else the wait before the next one."""
        status = None if response is None else response.status_code
        retryable = error is not None or status in self.retry.statuses
        delay = None
        if retryable and attempt < self.retry.max_attempts:
            delay = self.retry.delay_s(attempt, None if response is None else response.headers.get("Retry-After"))
        if self.on_attempt is not None:
            self.on_attempt(Attempt(attempt, status, None if error is None else repr(error), delay))
        return delay

    @staticmethod
    def answer(response: httpx.Response | None, error: Exception | None, batch: bool) -> list[StoredReward]:
        if response is None:
            raise RewardError(f"no answer from the gateway: {error!r}") from error
        if response.status_code != 200:
            raise _refusal(response)
        replayed = response.headers.get(REPLAYED_HEADER, "").lower() == "true"
        payload = response.json()
        items = payload["data"] if batch else [payload]
        return [StoredReward.of(item, replayed) for item in items]


class RewardClient:
    """Posts rewards with retries (blocking). Close it, or use it as a context manager."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        webhook_secret: str | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        http_client: httpx.Client | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        """`base_url`: the gateway (`http://host:8000` or `.../v1`; default $APPRENTICE_BASE_URL, else
        $OPENAI_BASE_URL). `api_key` (default $APPRENTICE_API_KEY, else $OPENAI_API_KEY) or
        `webhook_secret` (sign instead). `on_attempt(Attempt)` is called after every attempt."""
        self._sender = _Sender(base_url, api_key, webhook_secret, retry or RetryPolicy(), on_attempt)
        self._own_client = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout_s)

    def post(self, reward: Reward) -> StoredReward:
        """Post one reward; its stored form (status `linked` or `pending`)."""
        return self._send([reward], batch=False)[0]

    def post_batch(self, rewards: Sequence[Reward]) -> list[StoredReward]:
        """Post rewards as one batch (stored all together or not at all), in request order."""
        return self._send(rewards, batch=True)

    def _send(self, rewards: Sequence[Reward], batch: bool) -> list[StoredReward]:
        body = self._sender.body(rewards, batch)
        attempt = 0
        while True:
            attempt += 1
            response: httpx.Response | None = None
            error: Exception | None = None
            try:
                response = self._http.post(self._sender.url, content=body, headers=self._sender.headers(body))
            except httpx.TransportError as exc:
                error = exc
            delay = self._sender.next_delay(attempt, response, error)
            if delay is None:
                return self._sender.answer(response, error, batch)
            time.sleep(delay)

    def close(self) -> None:
        if self._own_client:
            self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRewardClient:
    """Posts rewards with retries, for asyncio code. `aclose()` it, or use `async with`."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        webhook_secret: str | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        http_client: httpx.AsyncClient | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        """The same arguments as `RewardClient`."""
        self._sender = _Sender(base_url, api_key, webhook_secret, retry or RetryPolicy(), on_attempt)
        self._own_client = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout_s)

    async def post(self, reward: Reward) -> StoredReward:
        return (await self._send([reward], batch=False))[0]

    async def post_batch(self, rewards: Sequence[Reward]) -> list[StoredReward]:
        return await self._send(rewards, batch=True)

    async def _send(self, rewards: Sequence[Reward], batch: bool) -> list[StoredReward]:
        body = self._sender.body(rewards, batch)
        attempt = 0
        while True:
            attempt += 1
            response: httpx.Response | None = None
            error: Exception | None = None
            try:
                response = await self._http.post(self._sender.url, content=body, headers=self._sender.headers(body))
            except httpx.TransportError as exc:
                error = exc
            delay = self._sender.next_delay(attempt, response, error)
            if delay is None:
                return self._sender.answer(response, error, batch)
            await asyncio.sleep(delay)

    async def aclose(self) -> None:
        if self._own_client:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
