"""Exploration samples: extra answers from the lineage head, recorded as unserved attempts.

A prompt that never repeats is a group of one, whose GRPO advantage is zero: nothing trains.
So, for a budgeted share of a policy's calls, after the client has its answer, the gateway asks
the policy's lineage head (gateway/policies/versions.py: the version the learner continues,
whatever the canary share, so the samples are on-policy for it) for `extra_answers` more
answers to the same request, and records each as a trajectory of its own in the served call's
group (its group id, else the same task: the request is the same) with the exact token ids
and logprobs the endpoint returned, marked unserved (`served` false in the journal record:
`trajectories.served`, `calls.explores_call_id`). They are never returned to anyone.

Off the request path: the handler only calls `offer` (a dict lookup, a few checks and a
`put_nowait`); each policy has a bounded queue and `concurrency` tasks in each gateway process.
A full queue drops the exploration (counted), never delays a client. The requests go at low
priority (vLLM's `priority` field, and the local server's: started only while no client request
waits, abandoned when one arrives), to the endpoint that served the call (its prompt is cached
there), non-streamed, with `n` = k. The budget (budget.py) bounds the tokens generated an hour.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from apprentice.settings import ExplorationSettings, PolicySettings, Settings
from gateway import metrics
from gateway.exploration.budget import HourlyTokenBudget
from gateway.exploration.eligibility import ServedCall, skip_reason
from gateway.policies.versions import PolicyVersions, ServingVersion
from gateway.trajectories.stitching import new_call_id, new_trajectory_id

log = logging.getLogger(__name__)

# Fields of the client's body that exploration sets itself.
_REPLACED = ("stream", "stream_options", "max_completion_tokens", "n")


def exploration_body(call: ServedCall, settings: ExplorationSettings, model: str, max_tokens: int) -> dict[str, Any]:
    """The request for the extra answers: the client's, non-streamed, k answers, with tokens."""
    body = {k: v for k, v in call.body.items() if k not in _REPLACED}
    body.update(
        model=model,
        n=settings.extra_answers,
        stream=False,
        max_tokens=max_tokens,
        logprobs=True,
        return_token_ids=True,
    )
    if call.temperature is not None:
        body["temperature"] = call.temperature
    if settings.priority is not None:
        body["priority"] = settings.priority
    return body


def answer_max_tokens(call: ServedCall, settings: ExplorationSettings) -> int:
    """Each extra answer's cap: the client's own when it set one (same distribution as the served
    answer), else the exploration's."""
    for field in ("max_completion_tokens", "max_tokens"):
        value = call.body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return settings.max_tokens


def completion_tokens(choice: dict[str, Any]) -> int:
    token_ids = choice.get("token_ids")
    if isinstance(token_ids, list):
        return len(token_ids)
    content = (choice.get("logprobs") or {}).get("content")
    return len(content) if isinstance(content, list) else 0


def unserved_records(
    call: ServedCall,
    answer: dict[str, Any],
    head: ServingVersion | None,
    upstream_model: str,
    created_at: float,
    latency_ms: float,
    secret: bytes,
) -> list[dict[str, Any]]:
    """One journal record per extra answer: a trajectory of one call, unserved, in the served
    call's group, shaped as a served call's record is (the learner reads it the same way)."""
    records = []
    for choice in answer.get("choices") or []:
        completion = completion_tokens(choice)
        prompt = (answer.get("usage") or {}).get("prompt_tokens")
        response = {
            **answer,
            "choices": [{**choice, "index": 0}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": (prompt or 0) + completion,
            },
        }
        records.append(
            {
                "id": str(new_call_id()),
                "response_id": None,  # never a previous_response_id a client could continue
                "protocol": "chat.completions",
                "native_request": None,
                "native_response": None,
                # an id the gateway issues to the tenant, as for any new run (rewards can name it)
                "trajectory_id": str(new_trajectory_id(secret, call.tenant)),
                "client_trajectory_id": None,
                "group_id": call.group_id,
                "tenant": call.tenant,
                "api_key_id": str(call.api_key_id) if call.api_key_id else None,
                "model": call.model,
                "policy": call.policy.name,
                "upstream": call.target.name,
                "upstream_model": upstream_model,
                "adapter_version_id": str(head.id) if head is not None else None,
                "created_at": created_at,
                "latency_ms": latency_ms,
                "ttft_ms": None,
                "status_code": 200,
                "error": None,
                "stream": False,
                "request": call.body,
                "response": response,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "temperature": call.temperature,
                # No continuation key: a client's next call continues the served answer, never this one.
                "continuation_key": None,
                "parent_key": None,
                "stitch_pending": False,
                "trainable": True,
                "served": False,
                "explores_call_id": str(call.call_id),
            }
        )
    return records


class PolicyExplorer:
    """One policy's exploration in this process: its queue, its budget, its tasks."""

    def __init__(
        self,
        policy: PolicySettings,
        versions: PolicyVersions,
        record: Callable[[dict[str, Any]], None],
        session: Callable[[], aiohttp.ClientSession],
        secret: Callable[[], bytes],
    ) -> None:
        self.policy = policy
        self.secret = secret
        self.settings = policy.learning.exploration
        self.versions = versions
        self.record = record
        self.session = session
        self.budget = HourlyTokenBudget(self.settings.budget_tokens_per_hour)
        self.queue: asyncio.Queue[ServedCall] = asyncio.Queue(maxsize=self.settings.queue_size)
        self.tasks: list[asyncio.Task[None]] = []
        self.outcomes: dict[str, int] = {}

    def _count(self, outcome: str, counter: Any) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        counter.labels(self.policy.name, outcome).inc()

    def offer(self, call: ServedCall) -> None:
        reason = skip_reason(call)
        if reason is None and self.settings.share < 1.0 and random.random() >= self.settings.share:
            reason = "share"
        if reason is not None:
            self._count(f"skipped_{reason}", metrics.EXPLORATION_CALLS)
            return
        try:
            self.queue.put_nowait(call)
        except asyncio.QueueFull:
            self._count("queue_full", metrics.EXPLORATION_CALLS)
            return
        self._count("queued", metrics.EXPLORATION_CALLS)

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._work(), name=f"exploration-{self.policy.name}-{i}")
            for i in range(self.settings.concurrency)
        ]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []

    async def _work(self) -> None:
        while True:
            call = await self.queue.get()
            try:
                await self.explore(call)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad answer must not stop exploration
                log.exception("exploration of call %s failed", call.call_id)
                self._count("failed", metrics.EXPLORATION_REQUESTS)

    async def explore(self, call: ServedCall) -> None:
        """Ask the lineage head for the extra answers and record them; the budget first."""
        max_tokens = answer_max_tokens(call, self.settings)
        reservation = self.budget.reserve(self.settings.extra_answers * max_tokens)
        if reservation is None:
            self._count("over_budget", metrics.EXPLORATION_REQUESTS)
            return
        head = self.versions.lineage_head(self.policy.name)
        model = head.name if head is not None else call.target.upstream_model
        body = exploration_body(call, self.settings, model, max_tokens)
        target = call.target
        started, created_at = time.perf_counter(), time.time()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, target.timeout), sock_read=target.timeout)
        try:
            async with self.session().post(
                target.api_base + "/chat/completions",
                data=orjson.dumps(body),
                headers=target.headers(),
                timeout=timeout,
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientConnectionError, OSError) as exc:
            # Not connected: nothing was generated. A timeout or a reset mid-answer keeps its reservation.
            connected = not isinstance(exc, (aiohttp.ClientConnectorError, ConnectionRefusedError))
            self.budget.settle(reservation, reservation.tokens if connected else 0)
            self._count("unreachable", metrics.EXPLORATION_REQUESTS)
            metrics.EXPLORATION_BUDGET_USED.labels(self.policy.name).set(self.budget.used())
            return
        except asyncio.TimeoutError:
            self._count("timeout", metrics.EXPLORATION_REQUESTS)
            return
        latency_ms = (time.perf_counter() - started) * 1000.0
        if status != 200:
            # 404: the head's adapter is not at the endpoint yet (a candidate not loaded); 503: the
            # local server abandoned it for a client request. Some tokens may have been generated:
            # the reservation stands.
            outcome = {404: "adapter_missing", 503: "abandoned"}.get(status, "upstream_error")
            self._count(outcome, metrics.EXPLORATION_REQUESTS)
            metrics.EXPLORATION_BUDGET_USED.labels(self.policy.name).set(self.budget.used())
            return
        answer = orjson.loads(raw)
        records = unserved_records(call, answer, head, model, created_at, latency_ms, self.secret())
        generated = sum(record["completion_tokens"] for record in records)
        self.budget.settle(reservation, generated)
        for record in records:
            self.record(record)
        metrics.EXPLORATION_TOKENS.labels(self.policy.name).inc(generated)
        metrics.EXPLORATION_ANSWERS.labels(self.policy.name).inc(len(records))
        metrics.EXPLORATION_BUDGET_USED.labels(self.policy.name).set(self.budget.used())
        self._count("recorded", metrics.EXPLORATION_REQUESTS)


class Explorer:
    """Every exploring policy's PolicyExplorer in this gateway process."""

    def __init__(
        self,
        settings: Settings,
        versions: PolicyVersions,
        record: Callable[[dict[str, Any]], None],
        session: Callable[[], aiohttp.ClientSession],
        secret: Callable[[], bytes],
    ) -> None:
        self._settings = settings
        self._secret = secret
        self._versions = versions
        self._record = record
        self._session = session
        self.policies: dict[str, PolicyExplorer] = {}
        self.enabled = any(policy.learning.exploration.enabled for policy in settings.policies)

    def start(self) -> None:
        """Make the queues and tasks (inside the running event loop)."""
        for policy in self._settings.policies:
            if policy.learning.exploration.enabled:
                explorer = PolicyExplorer(policy, self._versions, self._record, self._session, self._secret)
                explorer.start()
                self.policies[policy.name] = explorer

    async def stop(self) -> None:
        """Queued explorations are dropped: no client is waiting for them."""
        for explorer in self.policies.values():
            await explorer.stop()

    def offer(self, call: ServedCall) -> None:
        """Called by the chat handler after the client has its answer; never waits."""
        explorer = self.policies.get(call.policy.name)
        if explorer is not None:
            explorer.offer(call)

    def report(self) -> dict[str, Any]:
        """This process's view, for the admin API: budget used in the last hour and outcomes."""
        return {
            name: {
                "extra_answers": explorer.settings.extra_answers,
                "budget_tokens_per_hour": explorer.settings.budget_tokens_per_hour,
                "used_last_hour": explorer.budget.used(),
                "generated_tokens_total": explorer.budget.generated_total,
                "queued": explorer.queue.qsize(),
                "outcomes": dict(explorer.outcomes),
            }
            for name, explorer in self.policies.items()
        }
