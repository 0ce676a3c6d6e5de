"""Score one version (or the base model) on an evaluation set through the policy's endpoints.

The version answers every item at the policy's inference endpoints under its LoRA name (loaded
there first, idempotently, as promotion does: a loaded adapter serves no traffic until its status
says so), the base model under the policy's `base_model`; greedy (temperature 0), at most
`evaluation.max_tokens`. Each answer is scored (`scoring`) and the run is stored with its
per-item results (`store`). An item whose answer or score failed has no score in the run, with
the reason; the run itself fails only when the version cannot be reached at all.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.discovery.directory import current_endpoints
from apprentice.evalsets import store
from apprentice.evalsets.scoring import Scorer, ScoringFailed, parse_scoring
from apprentice.promotion import lifecycle, loading
from apprentice.promotion.rows import AdapterVersion
from apprentice.settings import PolicySettings, Settings, resolve_secret

__all__ = ["EvalUnavailable", "ScoredRun", "score_on_set", "target_of"]


class EvalUnavailable(RuntimeError):
    """The set could not be scored at all (no items, no endpoint, the adapter would not load)."""


@dataclass(frozen=True)
class ScoredRun:
    run: store.EvalRun
    results: dict[uuid.UUID, store.EvalResult]


def target_of(policy: PolicySettings, version: AdapterVersion | None) -> str:
    """The model name the endpoints know the version by (the base model for None)."""
    return version.name if version is not None else policy.base_model


async def _answer(
    client: httpx.AsyncClient, endpoint: str, target: str, item: store.EvalItem, policy: PolicySettings
) -> str:
    key = resolve_secret(policy.api_key)
    body: dict[str, Any] = {
        "model": target,
        "messages": item.messages,
        "temperature": 0.0,
        "max_tokens": policy.evaluation.max_tokens,
    }
    response = await client.post(
        f"{endpoint.rstrip('/')}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"} if key else {},
        timeout=policy.evaluation.timeout_s,
    )
    if response.status_code != 200:
        raise ScoringFailed(f"{endpoint} answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        content = response.json()["choices"][0]["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ScoringFailed(f"{endpoint} answered something that is not a chat completion: {exc}") from exc
    return content if isinstance(content, str) else ""


async def score_on_set(
    engine: AsyncEngine,
    settings: Settings,
    policy: PolicySettings,
    eval_set: store.EvalSet,
    version: AdapterVersion | None,
    *,
    trigger: str,
    client: httpx.AsyncClient | None = None,
) -> ScoredRun:
    """Answer and score every item of `eval_set` with `version` (None: the base model); stored."""
    items = await store.items_of(engine, eval_set.id)
    if not items:
        raise EvalUnavailable(f"evaluation set {eval_set.name!r} has no items")
    endpoints, unresolved = await current_endpoints(settings.endpoint_discovery, policy)
    if not endpoints:
        detail = f" ({', '.join(unresolved)} unresolved)" if unresolved else ""
        raise EvalUnavailable(f"policy {policy.name!r} has no inference endpoint to score on{detail}")
    target = target_of(policy, version)
    own = client is None
    client = client or httpx.AsyncClient(timeout=policy.evaluation.timeout_s)
    try:
        if version is not None:
            if (deleted := lifecycle.files_deleted(version)) is not None:
                raise EvalUnavailable(str(deleted))
            try:
                await loading.ensure_loaded(
                    endpoints, version.name, version.path, api_key=resolve_secret(policy.api_key), client=client
                )
            except loading.LoadError as exc:
                raise EvalUnavailable(str(exc)) from exc
        run_id = await store.start_run(
            engine,
            eval_set,
            version_id=version.id if version is not None else None,
            target=target,
            trigger=trigger,
            items=len(items),
        )
        scorer = Scorer(settings, policy, client)
        limit = asyncio.Semaphore(policy.evaluation.concurrency)

        async def one(index: int, item: store.EvalItem) -> store.EvalResult:
            async with limit:
                answer: str | None = None
                try:
                    scoring = parse_scoring(item.scoring or eval_set.scoring)
                    answer = await _answer(client, endpoints[index % len(endpoints)], target, item, policy)
                    context = {"set": eval_set.name, "item_id": item.id, "version": target, "run_id": run_id}
                    score = await scorer.score(scoring, item.messages, answer, context=context)
                except (ScoringFailed, ValidationError) as exc:
                    return store.EvalResult(item.id, None, answer, f"not scored: {exc}")
                except httpx.HTTPError as exc:
                    return store.EvalResult(item.id, None, answer, f"not scored: {type(exc).__name__}: {exc}")
                return store.EvalResult(item.id, score.value, answer, score.detail)

        results = await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    finally:
        if own:
            await client.aclose()
    run = await store.finish_run(engine, run_id, results)
    return ScoredRun(run, {result.item_id: result for result in results})
