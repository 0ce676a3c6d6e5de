"""The lifecycle of an adapter version, as a state machine in PostgreSQL.

    candidate -> canary -> promoted -> retired -> promoted (rollback)
        |          |
        +----------+--> rejected            candidate -> promoted ("promote now")

Each transition is one function and one transaction: it locks the policy (its
`policy_state` row, created on first use), then the version's row, re-reads the status under
the lock, updates the row(s) and writes one `adapter_transitions` row per changed version
(who: an admin key's name or "auto"; why: a reason). Two admins, or an admin and the
periodic job, asking for conflicting transitions of one policy are therefore serialised: the
second sees the first's outcome and either finds nothing to do or gets `TransitionError`.
The partial unique indexes (one promoted, one canary per policy) back this up.

Idempotent: asking for the status a version already has returns `changed=False` and writes
nothing. This module never talks to inference endpoints itself: `service` passes a `prepare`
hook that loads the adapter everywhere under the lock, before the update, so the status a
gateway reads always names an adapter that the endpoints serve.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Awaitable, Callable, Iterable

from sqlalchemy import func, insert, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from apprentice.store.tables import adapter_transitions, adapter_versions, policy_state

STATUSES = ("candidate", "canary", "promoted", "retired", "rejected")
SERVING = ("canary", "promoted")

# to_status <- allowed from_statuses. "retired" is only ever entered as the side effect of
# another version's promotion; "rejected" is final.
ALLOWED: dict[str, frozenset[str]] = {
    "canary": frozenset({"candidate"}),
    "promoted": frozenset({"candidate", "canary", "retired"}),
    "retired": frozenset({"promoted"}),
    "rejected": frozenset({"candidate", "canary"}),
    "candidate": frozenset(),
}

NOTIFY_CHANNEL = "apprentice_adapters"


class VersionNotFound(LookupError):
    def __init__(self, ref: object) -> None:
        super().__init__(f"no adapter version {ref}")


class TransitionError(Exception):
    """The transition is not allowed from the version's current status (HTTP 409)."""

    def __init__(self, message: str, current: str | None = None) -> None:
        super().__init__(message)
        self.current = current


def is_allowed(from_status: str, to_status: str) -> bool:
    return from_status in ALLOWED.get(to_status, frozenset())


@dataclass
class TransitionResult:
    version: dict[str, Any]
    changed: bool
    from_status: str
    # Versions that changed status as a side effect (the promoted version a promotion retires).
    side_effects: list[dict[str, Any]] = field(default_factory=list)
    # What `prepare` returned (the endpoints' load outcomes).
    prepared: Any = None


def _row(row: Any) -> dict[str, Any]:
    return dict(row._mapping)


async def lock_policy(connection: AsyncConnection, policy: str) -> None:
    """Serialise all transitions of one policy: lock its policy_state row (made on first use)."""
    await connection.execute(text("INSERT INTO policy_state (policy) VALUES (:p) ON CONFLICT (policy) DO NOTHING"),
                             {"p": policy})
    await connection.execute(select(policy_state.c.policy).where(policy_state.c.policy == policy).with_for_update())


async def get_version(connection: AsyncConnection, version_id: uuid.UUID, *, lock: bool = False) -> dict[str, Any]:
    query = select(adapter_versions).where(adapter_versions.c.id == version_id)
    if lock:
        query = query.with_for_update()
    row = (await connection.execute(query)).first()
    if row is None:
        raise VersionNotFound(version_id)
    return _row(row)


async def find_version(engine: AsyncEngine, ref: str | uuid.UUID, policy: str | None = None) -> dict[str, Any]:
    """A version by id, by LoRA name, or (with a policy) by its number ("3" or "v3")."""
    conditions = [adapter_versions.c.name == str(ref)]
    try:
        conditions.append(adapter_versions.c.id == uuid.UUID(str(ref)))
    except ValueError:
        number = str(ref).removeprefix("v")
        if policy is not None and number.isdigit():
            conditions.append(adapter_versions.c.version == int(number))
    query = select(adapter_versions).where(or_(*conditions))
    if policy is not None:
        query = query.where(adapter_versions.c.policy == policy)
    async with engine.connect() as connection:
        row = (await connection.execute(query)).first()
    if row is None:
        raise VersionNotFound(f"{ref!s}" + (f" of policy {policy!r}" if policy else ""))
    return _row(row)


async def serving_versions(connection: AsyncConnection, policy: str) -> dict[str, dict[str, Any]]:
    """{"promoted": row, "canary": row} for the versions of `policy` that serve now."""
    rows = await connection.execute(select(adapter_versions).where(
        adapter_versions.c.policy == policy, adapter_versions.c.status.in_(SERVING)))
    return {row.status: _row(row) for row in rows}


async def _record(connection: AsyncConnection, version: dict[str, Any], to_status: str, actor: str,
                  reason: str | None, values: dict[str, Any] | None = None) -> dict[str, Any]:
    updated = (await connection.execute(
        update(adapter_versions).where(adapter_versions.c.id == version["id"])
        .values(status=to_status, updated_at=func.now(), **(values or {}))
        .returning(*adapter_versions.c))).one()
    await connection.execute(insert(adapter_transitions).values(
        adapter_version_id=version["id"], policy=version["policy"], from_status=version["status"],
        to_status=to_status, actor=actor, reason=reason))
    await connection.execute(text("SELECT pg_notify(:channel, :policy)"),
                             {"channel": NOTIFY_CHANNEL, "policy": version["policy"]})
    return _row(updated)


def _refuse(version: dict[str, Any], to_status: str, allowed: Iterable[str]) -> TransitionError:
    allowed = sorted(allowed)
    return TransitionError(
        f"adapter version {version['name']} is {version['status']}: it cannot become {to_status} "
        f"(only from {', '.join(allowed) if allowed else 'no status'})", current=version["status"])


async def _begin(engine: AsyncEngine, version_id: uuid.UUID) -> tuple[Any, str]:
    async with engine.connect() as connection:
        version = await get_version(connection, version_id)
    return version, version["policy"]


async def transition(engine: AsyncEngine, version_id: uuid.UUID, to_status: str, *, actor: str,
                     reason: str | None = None, from_statuses: Iterable[str] | None = None,
                     canary_share: float | None = None, evaluation: dict[str, Any] | None = None,
                     prepare: Callable[[dict[str, Any]], Awaitable[Any]] | None = None) -> TransitionResult:
    """Move a version to `to_status` (canary, promoted or rejected) in one locked transaction.

    `from_statuses` narrows the allowed origins (the periodic job promotes only canaries, a
    rollback only retired versions). Promotion retires the version promoted before; a
    canary start refuses while another canary of the policy runs.

    `prepare(version)` runs under the policy lock after every check and before the update
    (the service loads the adapter at every endpoint there): if it raises, nothing changes.
    Holding the lock across it means the reconciler cannot unload the adapter between the
    load and the commit.
    """
    if to_status not in ("canary", "promoted", "rejected"):
        raise ValueError(f"no transition function for {to_status!r}")
    allowed = ALLOWED[to_status] if from_statuses is None else ALLOWED[to_status] & frozenset(from_statuses)
    _, policy = await _begin(engine, version_id)
    async with engine.begin() as connection:
        await lock_policy(connection, policy)
        version = await get_version(connection, version_id, lock=True)
        if version["status"] == to_status:
            return TransitionResult(version, changed=False, from_status=to_status)
        if version["status"] not in allowed:
            raise _refuse(version, to_status, allowed)
        if to_status in SERVING and version["files_deleted_at"] is not None:
            raise TransitionError(f"adapter version {version['name']} cannot serve: its files were deleted "
                                  f"at {version['files_deleted_at'].isoformat()} (retention)", current=version["status"])
        serving = await serving_versions(connection, policy)
        side: list[dict[str, Any]] = []
        values: dict[str, Any] = {}
        if to_status == "canary":
            other = serving.get("canary")
            if other is not None:
                raise TransitionError(f"policy {policy!r} already has a canary ({other['name']}): promote or reject "
                                      "it first", current=version["status"])
            values["canary_share"] = canary_share
            if evaluation is not None:
                values["evaluation"] = evaluation
        elif to_status == "promoted":
            values["canary_share"] = None
        prepared = await prepare(version) if prepare is not None else None
        if to_status == "promoted" and serving.get("promoted") is not None:
            previous = serving["promoted"]
            side.append(await _record(connection, previous, "retired", actor,
                                      f"replaced by {version['name']}" + (f": {reason}" if reason else "")))
        updated = await _record(connection, version, to_status, actor, reason, values)
    return TransitionResult(updated, changed=True, from_status=version["status"], side_effects=side,
                            prepared=prepared)


async def start_canary(engine: AsyncEngine, version_id: uuid.UUID, *, actor: str, share: float,
                       reason: str | None = None, evaluation: dict[str, Any] | None = None,
                       prepare: Callable[[dict[str, Any]], Awaitable[Any]] | None = None) -> TransitionResult:
    return await transition(engine, version_id, "canary", actor=actor, reason=reason, canary_share=share,
                            evaluation=evaluation, prepare=prepare)


async def promote(engine: AsyncEngine, version_id: uuid.UUID, *, actor: str, reason: str | None = None,
                  from_statuses: Iterable[str] | None = None,
                  prepare: Callable[[dict[str, Any]], Awaitable[Any]] | None = None) -> TransitionResult:
    return await transition(engine, version_id, "promoted", actor=actor, reason=reason, from_statuses=from_statuses,
                            prepare=prepare)


async def reject(engine: AsyncEngine, version_id: uuid.UUID, *, actor: str, reason: str | None = None,
                 from_statuses: Iterable[str] | None = None) -> TransitionResult:
    return await transition(engine, version_id, "rejected", actor=actor, reason=reason, from_statuses=from_statuses)


async def rollback(engine: AsyncEngine, version_id: uuid.UUID, *, actor: str,
                   reason: str | None = None) -> TransitionResult:
    """Make a retired version promoted again (the promoted one is retired)."""
    return await transition(engine, version_id, "promoted", actor=actor, reason=reason or "rollback",
                            from_statuses=("retired",))


async def update_jsonb(engine: AsyncEngine, version_id: uuid.UUID, column: str, value: dict[str, Any]) -> None:
    """Replace the `gates` or `evaluation` document of a version (no status change)."""
    if column not in ("gates", "evaluation"):
        raise ValueError(column)
    async with engine.begin() as connection:
        await connection.execute(update(adapter_versions).where(adapter_versions.c.id == version_id)
                                 .values({column: value, "updated_at": func.now()}))


async def set_learning_paused(engine: AsyncEngine, policy: str, paused: bool, *, actor: str) -> dict[str, Any]:
    """Pause or resume learning for a policy (idempotent); returns the policy_state row."""
    async with engine.begin() as connection:
        row = (await connection.execute(text(
            "INSERT INTO policy_state (policy, learning_paused, updated_by, updated_at) "
            "VALUES (:p, :paused, :actor, now()) ON CONFLICT (policy) DO UPDATE "
            "SET learning_paused = excluded.learning_paused, updated_by = excluded.updated_by, updated_at = now() "
            "WHERE policy_state.learning_paused IS DISTINCT FROM excluded.learning_paused "
            "RETURNING policy, learning_paused, updated_by, updated_at"),
            {"p": policy, "paused": paused, "actor": actor})).first()
        if row is None:  # already in that state: nothing written
            row = (await connection.execute(select(policy_state).where(policy_state.c.policy == policy))).one()
    return _row(row)


async def learning_paused(connection: AsyncConnection, policy: str) -> bool:
    value = (await connection.execute(select(policy_state.c.learning_paused)
                                      .where(policy_state.c.policy == policy))).scalar()
    return bool(value)


async def last_transition_at(connection: AsyncConnection, version_id: uuid.UUID,
                             to_status: str | None = None) -> datetime | None:
    query = select(func.max(adapter_transitions.c.created_at)).where(
        adapter_transitions.c.adapter_version_id == version_id)
    if to_status is not None:
        query = query.where(adapter_transitions.c.to_status == to_status)
    return (await connection.execute(query)).scalar()


async def transitions_of(connection: AsyncConnection, version_id: uuid.UUID) -> list[dict[str, Any]]:
    rows = await connection.execute(select(adapter_transitions).where(
        adapter_transitions.c.adapter_version_id == version_id).order_by(adapter_transitions.c.id))
    return [_row(row) for row in rows]
