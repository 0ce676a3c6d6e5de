"""The eval_* tables: the one writer and the typed rows of evaluation sets, items, runs, results.

Items taken from recorded trajectories are snapshots: the conversation of the trajectory's
last call (its request messages, as recorded, i.e. redacted) is copied into the item, so a set
stays the same when history retention drops the calls it came from.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.store.tables import calls, eval_items, eval_results, eval_runs, eval_sets, rewards, trajectories

__all__ = [
    "EvalItem",
    "EvalResult",
    "EvalRun",
    "EvalSet",
    "NewItem",
    "SetExists",
    "SetNotFound",
    "TrajectoryQuery",
    "add_items",
    "create_set",
    "delete_item",
    "delete_set",
    "finish_run",
    "get_set",
    "items_of",
    "latest_runs",
    "list_sets",
    "results_of",
    "runs_of",
    "start_run",
    "trajectory_items",
]

FINISHED, FAILED, RUNNING = "finished", "failed", "running"


class SetNotFound(LookupError):
    def __init__(self, policy: str, name: str) -> None:
        super().__init__(f"policy {policy!r} has no evaluation set {name!r}")


class SetExists(ValueError):
    def __init__(self, policy: str, name: str) -> None:
        super().__init__(f"policy {policy!r} already has an evaluation set {name!r}")


@dataclass(frozen=True)
class EvalSet:
    id: uuid.UUID
    policy: str
    name: str
    description: str | None
    scoring: dict[str, Any]
    created_by: str | None
    created_at: datetime
    items: int = 0


@dataclass(frozen=True)
class EvalItem:
    id: uuid.UUID
    set_id: uuid.UUID
    messages: list[dict[str, Any]]
    source_trajectory_id: uuid.UUID | None
    scoring: dict[str, Any] | None
    created_at: datetime


@dataclass(frozen=True)
class NewItem:
    messages: list[dict[str, Any]]
    scoring: dict[str, Any] | None = None
    source_trajectory_id: uuid.UUID | None = None


@dataclass(frozen=True)
class EvalRun:
    id: uuid.UUID
    set_id: uuid.UUID
    policy: str
    adapter_version_id: uuid.UUID | None
    target: str
    trigger: str
    status: str
    items: int
    scored: int
    mean: float | None
    error: str | None
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class EvalResult:
    item_id: uuid.UUID
    score: float | None
    answer: str | None
    detail: str | None


def _set(row: Any, items: int = 0) -> EvalSet:
    m = row._mapping
    return EvalSet(
        m["id"], m["policy"], m["name"], m["description"], m["scoring"], m["created_by"], m["created_at"], items
    )


def _item(row: Any) -> EvalItem:
    m = row._mapping
    return EvalItem(m["id"], m["set_id"], m["messages"], m["source_trajectory_id"], m["scoring"], m["created_at"])


def _run(row: Any) -> EvalRun:
    m = row._mapping
    return EvalRun(**{name: m[name] for name in EvalRun.__dataclass_fields__})


_ITEM_COUNT = select(func.count()).where(eval_items.c.set_id == eval_sets.c.id).scalar_subquery()


async def create_set(
    engine: AsyncEngine,
    policy: str,
    name: str,
    scoring: dict[str, Any],
    *,
    description: str | None = None,
    created_by: str | None = None,
) -> EvalSet:
    try:
        async with engine.begin() as connection:
            row = (
                await connection.execute(
                    insert(eval_sets)
                    .values(
                        id=uuid.uuid4(),
                        policy=policy,
                        name=name,
                        scoring=scoring,
                        description=description,
                        created_by=created_by,
                    )
                    .returning(*eval_sets.c)
                )
            ).one()
    except IntegrityError:
        raise SetExists(policy, name) from None
    return _set(row)


async def list_sets(engine: AsyncEngine, policy: str | None = None) -> list[EvalSet]:
    query = select(*eval_sets.c, _ITEM_COUNT.label("n")).order_by(eval_sets.c.policy, eval_sets.c.name)
    if policy is not None:
        query = query.where(eval_sets.c.policy == policy)
    async with engine.connect() as connection:
        return [_set(row, row.n) for row in await connection.execute(query)]


async def get_set(engine: AsyncEngine, policy: str, name: str) -> EvalSet:
    if "\x00" in policy + name:  # no stored name holds one (PostgreSQL text cannot)
        raise SetNotFound(policy, name)
    query = select(*eval_sets.c, _ITEM_COUNT.label("n")).where(eval_sets.c.policy == policy, eval_sets.c.name == name)
    async with engine.connect() as connection:
        row = (await connection.execute(query)).first()
    if row is None:
        raise SetNotFound(policy, name)
    return _set(row, row.n)


async def delete_set(engine: AsyncEngine, policy: str, name: str) -> None:
    """Delete a set with its items, runs and results (SetNotFound when there is none)."""
    async with engine.begin() as connection:
        deleted = await connection.execute(
            delete(eval_sets).where(eval_sets.c.policy == policy, eval_sets.c.name == name).returning(eval_sets.c.id)
        )
        if deleted.first() is None:
            raise SetNotFound(policy, name)


async def add_items(engine: AsyncEngine, set_id: uuid.UUID, items: Sequence[NewItem]) -> list[EvalItem]:
    if not items:
        return []
    rows = [
        {
            "id": uuid.uuid4(),
            "set_id": set_id,
            "messages": item.messages,
            "scoring": item.scoring,
            "source_trajectory_id": item.source_trajectory_id,
        }
        for item in items
    ]
    async with engine.begin() as connection:
        result = await connection.execute(insert(eval_items).returning(*eval_items.c), rows)
        return [_item(row) for row in result]


async def items_of(engine: AsyncEngine, set_id: uuid.UUID) -> list[EvalItem]:
    query = select(eval_items).where(eval_items.c.set_id == set_id).order_by(eval_items.c.created_at, eval_items.c.id)
    async with engine.connect() as connection:
        return [_item(row) for row in await connection.execute(query)]


async def delete_item(engine: AsyncEngine, set_id: uuid.UUID, item_id: uuid.UUID) -> bool:
    async with engine.begin() as connection:
        deleted = await connection.execute(
            delete(eval_items).where(eval_items.c.set_id == set_id, eval_items.c.id == item_id)
        )
    return bool(deleted.rowcount)


@dataclass(frozen=True)
class TrajectoryQuery:
    """Which recorded trajectories of the policy become items: those whose last call is in
    [since, until), with a current reward `reward_name` at least `min_reward` when given, newest first."""

    since: datetime | None = None
    until: datetime | None = None
    reward_name: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    limit: int = 100


async def trajectory_items(
    engine: AsyncEngine,
    policy: str,
    *,
    ids: Sequence[uuid.UUID] | None = None,
    query: TrajectoryQuery | None = None,
    scoring: dict[str, Any] | None = None,
) -> tuple[list[NewItem], list[uuid.UUID]]:
    """Items from the policy's recorded trajectories (by id, or by `query`), and the ids asked
    for that are not the policy's or have no recorded conversation."""
    chosen = select(trajectories.c.id).where(trajectories.c.policy == policy, trajectories.c.merged_into.is_(None))
    if ids is not None:
        chosen = chosen.where(trajectories.c.id.in_(list(ids)))
    if query is not None:
        if query.since is not None:
            chosen = chosen.where(trajectories.c.last_call_at >= query.since)
        if query.until is not None:
            chosen = chosen.where(trajectories.c.last_call_at < query.until)
        if query.reward_name is not None and (query.min_reward is not None or query.max_reward is not None):
            current = select(rewards.c.value).where(
                rewards.c.trajectory_id == trajectories.c.id,
                rewards.c.name == query.reward_name,
                rewards.c.status == "linked",
                rewards.c.superseded_at.is_(None),
            )
            value = current.scalar_subquery()
            if query.min_reward is not None:
                chosen = chosen.where(value >= query.min_reward)
            if query.max_reward is not None:
                chosen = chosen.where(value <= query.max_reward)
        chosen = chosen.order_by(trajectories.c.last_call_at.desc()).limit(query.limit)
    last_call = (
        select(calls.c.trajectory_id, calls.c.request)
        .distinct(calls.c.trajectory_id)
        .where(calls.c.trajectory_id.in_(chosen.scalar_subquery()), calls.c.status_code == 200)
        .order_by(calls.c.trajectory_id, calls.c.created_at.desc())
    )
    async with engine.connect() as connection:
        found = {row.trajectory_id: row.request for row in await connection.execute(last_call)}
    items = [
        NewItem(messages=request["messages"], scoring=scoring, source_trajectory_id=trajectory_id)
        for trajectory_id, request in sorted(found.items(), key=lambda pair: str(pair[0]))
        if isinstance(request, dict) and isinstance(request.get("messages"), list) and request["messages"]
    ]
    kept = {item.source_trajectory_id for item in items}
    missing = [trajectory_id for trajectory_id in (ids or []) if trajectory_id not in kept]
    return items, missing


async def start_run(
    engine: AsyncEngine,
    eval_set: EvalSet,
    *,
    version_id: uuid.UUID | None,
    target: str,
    trigger: str,
    items: int,
) -> uuid.UUID:
    run_id = uuid.uuid4()
    async with engine.begin() as connection:
        await connection.execute(
            insert(eval_runs).values(
                id=run_id,
                set_id=eval_set.id,
                policy=eval_set.policy,
                adapter_version_id=version_id,
                target=target,
                trigger=trigger,
                items=items,
            )
        )
    return run_id


async def finish_run(
    engine: AsyncEngine, run_id: uuid.UUID, results: Sequence[EvalResult], *, error: str | None = None
) -> EvalRun:
    """Store a run's results and its summary in one transaction (failed when `error` is given)."""
    scores = [r.score for r in results if r.score is not None and math.isfinite(r.score)]
    async with engine.begin() as connection:
        if results:
            await connection.execute(
                insert(eval_results),
                [
                    {"run_id": run_id, "item_id": r.item_id, "score": r.score, "answer": r.answer, "detail": r.detail}
                    for r in results
                ],
            )
        row = (
            await connection.execute(
                update(eval_runs)
                .where(eval_runs.c.id == run_id)
                .values(
                    status=FAILED if error else FINISHED,
                    scored=len(scores),
                    mean=sum(scores) / len(scores) if scores else None,
                    error=error,
                    finished_at=func.now(),
                )
                .returning(*eval_runs.c)
            )
        ).one()
    return _run(row)


async def results_of(engine: AsyncEngine, run_id: uuid.UUID) -> dict[uuid.UUID, EvalResult]:
    query = select(eval_results).where(eval_results.c.run_id == run_id)
    async with engine.connect() as connection:
        return {
            row.item_id: EvalResult(row.item_id, row.score, row.answer, row.detail)
            for row in await connection.execute(query)
        }


async def runs_of(
    engine: AsyncEngine,
    *,
    set_id: uuid.UUID | None = None,
    version_id: uuid.UUID | None = None,
    policy: str | None = None,
    limit: int = 50,
) -> list[EvalRun]:
    """Runs, newest first: of a set, of a version (on any set), or of a policy."""
    query = select(eval_runs).order_by(eval_runs.c.started_at.desc()).limit(limit)
    if set_id is not None:
        query = query.where(eval_runs.c.set_id == set_id)
    if version_id is not None:
        query = query.where(eval_runs.c.adapter_version_id == version_id)
    if policy is not None:
        query = query.where(eval_runs.c.policy == policy)
    async with engine.connect() as connection:
        return [_run(row) for row in await connection.execute(query)]


async def latest_runs(engine: AsyncEngine, set_id: uuid.UUID, target: str) -> list[EvalRun]:
    """The finished runs of `target` (a LoRA name or the base model) on the set, newest first."""
    query = (
        select(eval_runs)
        .where(eval_runs.c.set_id == set_id, eval_runs.c.target == target, eval_runs.c.status == FINISHED)
        .order_by(eval_runs.c.started_at.desc())
        .limit(5)
    )
    async with engine.connect() as connection:
        return [_run(row) for row in await connection.execute(query)]
