"""The lifecycle of an adapter version, as a state machine in PostgreSQL.

The statuses and the allowed transitions are `status.VersionStatus` and `status.ALLOWED`.
This module is the only writer of `adapter_versions` and `adapter_transitions` rows: the
learner records a new candidate with `record_candidate` (inside its own transaction), and
every later status change goes through `transition`.

Each transition is one function and one transaction: it locks the policy (its
`policy_state` row, created on first use), then the version's row, re-reads the status under
the lock, updates the row(s) and writes one `adapter_transitions` row per changed version
(who: an admin key's name or "auto"; why: a reason). Two admins, or an admin and the
periodic job, asking for conflicting transitions of one policy are therefore serialised: the
second sees the first's outcome and either finds nothing to do or gets `TransitionError`.
The partial unique indexes (one promoted, one canary per policy) back this up.

Idempotent: asking for the status a version already has returns `changed=False` and writes
nothing. This module never talks to inference endpoints itself: `serving` passes a `prepare`
hook that loads the adapter everywhere under the lock, before the update, so the status a
gateway reads always names an adapter that the endpoints serve.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

import psycopg
from sqlalchemy import Insert, func, insert, or_, select, text, update
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from apprentice.promotion.lineage import LINEAGE_STATUSES, lineage_versions
from apprentice.promotion.rows import AdapterVersion, PolicyState, Transition
from apprentice.promotion.status import ALLOWED, SERVING, VersionStatus
from apprentice.store.tables import adapter_transitions, adapter_versions, policy_state

__all__ = [
    "ALLOWED",
    "NOTIFY_CHANNEL",
    "SERVING",
    "STATUSES",
    "NewCandidate",
    "Prepare",
    "Serving",
    "TransitionError",
    "TransitionResult",
    "VersionNotFound",
    "VersionStatus",
    "candidate_rows",
    "files_deleted",
    "find_version",
    "get_version",
    "is_allowed",
    "last_transition_at",
    "learning_paused",
    "lineage_started_at",
    "lock_policy",
    "next_version_number",
    "policy_states",
    "promote",
    "record_candidate",
    "refusal",
    "reject",
    "reject_lineage",
    "rollback",
    "serving_versions",
    "set_learning_paused",
    "start_canary",
    "supersede_canary",
    "transition",
    "transitions_of",
    "update_jsonb",
    "versions_of",
]

STATUSES: tuple[VersionStatus, ...] = tuple(VersionStatus)

NOTIFY_CHANNEL = "apprentice_adapters"
MAX_VERSION_NUMBER = 2**31 - 1  # adapter_versions.version is a PostgreSQL integer

Prepare = Callable[[AdapterVersion], Awaitable[Any]]


class VersionNotFound(LookupError):
    def __init__(self, ref: object) -> None:
        super().__init__(f"no adapter version {ref}")


class TransitionError(Exception):
    """The transition is not allowed from the version's current status (HTTP 409)."""

    def __init__(self, message: str, current: VersionStatus | None = None) -> None:
        super().__init__(message)
        self.current = current


def is_allowed(from_status: str, to_status: str) -> bool:
    return VersionStatus(from_status).may_become(VersionStatus(to_status))


def refusal(version: AdapterVersion, to_status: VersionStatus, allowed: Iterable[VersionStatus]) -> TransitionError:
    """The error for a transition `version`'s status does not allow (naming the statuses that would)."""
    origins = sorted(status.value for status in allowed)
    return TransitionError(
        f"adapter version {version.name} is {version.status}: it cannot become {to_status} "
        f"(only from {', '.join(origins) if origins else 'no status'})",
        current=version.status,
    )


def files_deleted(version: AdapterVersion) -> TransitionError | None:
    """The error for making a version serve whose files retention deleted; None when they are there."""
    if version.files_deleted_at is None:
        return None
    return TransitionError(
        f"adapter version {version.name} cannot serve: its files were deleted at "
        f"{version.files_deleted_at.isoformat()} (retention)",
        current=version.status,
    )


@dataclass
class TransitionResult:
    version: AdapterVersion
    changed: bool
    from_status: VersionStatus
    # Versions that changed status as a side effect (the promoted version a promotion retires).
    side_effects: list[AdapterVersion] = field(default_factory=list)
    # What `prepare` returned (the endpoints' load outcomes).
    prepared: Any = None


@dataclass(frozen=True)
class Serving:
    """The versions of a policy that serve now (at most one of each)."""

    promoted: AdapterVersion | None = None
    canary: AdapterVersion | None = None


# ---------------------------------------------------------------- reads


async def lock_policy(connection: AsyncConnection, policy: str) -> None:
    """Serialise all transitions of one policy: lock its policy_state row (made on first use)."""
    await connection.execute(
        text("INSERT INTO policy_state (policy) VALUES (:p) ON CONFLICT (policy) DO NOTHING"), {"p": policy}
    )
    await connection.execute(select(policy_state.c.policy).where(policy_state.c.policy == policy).with_for_update())


async def get_version(connection: AsyncConnection, version_id: uuid.UUID, *, lock: bool = False) -> AdapterVersion:
    query = select(adapter_versions).where(adapter_versions.c.id == version_id)
    if lock:
        query = query.with_for_update()
    row = (await connection.execute(query)).first()
    if row is None:
        raise VersionNotFound(version_id)
    return AdapterVersion.from_row(row)


async def find_version(engine: AsyncEngine, ref: str | uuid.UUID, policy: str | None = None) -> AdapterVersion:
    """A version by id, by LoRA name, or (with a policy) by its number ("3" or "v3")."""
    if "\x00" in str(ref):  # PostgreSQL text cannot hold NUL: no name has one
        raise VersionNotFound(repr(str(ref)) + (f" of policy {policy!r}" if policy else ""))
    conditions = [adapter_versions.c.name == str(ref)]
    try:
        conditions.append(adapter_versions.c.id == uuid.UUID(str(ref)))
    except ValueError:
        number = str(ref).removeprefix("v")
        # Only a number the column can hold names a version (a larger one, or a digit outside
        # ASCII, would fail in the database or in int() instead of finding nothing).
        if policy is not None and number.isascii() and number.isdigit() and int(number) <= MAX_VERSION_NUMBER:
            conditions.append(adapter_versions.c.version == int(number))
    query = select(adapter_versions).where(or_(*conditions))
    if policy is not None:
        query = query.where(adapter_versions.c.policy == policy)
    async with engine.connect() as connection:
        row = (await connection.execute(query)).first()
    if row is None:
        raise VersionNotFound(f"{ref!s}" + (f" of policy {policy!r}" if policy else ""))
    return AdapterVersion.from_row(row)


async def versions_of(
    connection: AsyncConnection, policy: str | None, statuses: Iterable[VersionStatus]
) -> list[AdapterVersion]:
    """The versions of `policy` (None: of every policy) in one of `statuses`, oldest first."""
    query = select(adapter_versions).where(adapter_versions.c.status.in_([s.value for s in statuses]))
    if policy is not None:
        query = query.where(adapter_versions.c.policy == policy)
    rows = await connection.execute(query.order_by(adapter_versions.c.policy, adapter_versions.c.version))
    return [AdapterVersion.from_row(row) for row in rows]


async def last_status_changes(connection: AsyncConnection, policy: str) -> dict[uuid.UUID, datetime]:
    """When each version of `policy` last changed status (its latest transition): the unload
    grace and retention count from it."""
    rows = await connection.execute(
        select(adapter_transitions.c.adapter_version_id, func.max(adapter_transitions.c.created_at))
        .where(adapter_transitions.c.policy == policy)
        .group_by(adapter_transitions.c.adapter_version_id)
    )
    return {row[0]: row[1] for row in rows}


async def serving_versions(connection: AsyncConnection, policy: str) -> Serving:
    """The promoted and the canary version of `policy`, where there are any."""
    by_status = {version.status: version for version in await versions_of(connection, policy, SERVING)}
    return Serving(promoted=by_status.get(VersionStatus.PROMOTED), canary=by_status.get(VersionStatus.CANARY))


async def learning_paused(connection: AsyncConnection, policy: str) -> bool:
    value = (
        await connection.execute(select(policy_state.c.learning_paused).where(policy_state.c.policy == policy))
    ).scalar()
    return bool(value)


async def last_transition_at(
    connection: AsyncConnection, version_id: uuid.UUID, to_status: VersionStatus | None = None
) -> datetime | None:
    query = select(func.max(adapter_transitions.c.created_at)).where(
        adapter_transitions.c.adapter_version_id == version_id
    )
    if to_status is not None:
        query = query.where(adapter_transitions.c.to_status == to_status.value)
    last: datetime | None = (await connection.execute(query)).scalar()
    return last


async def lineage_started_at(connection: AsyncConnection, policy: str) -> datetime | None:
    """When the live lineage's first canary started: the earliest transition to canary of any
    lineage version (None: no lineage version has served yet).

    Derived from `adapter_transitions` rather than stored on the canary: the rows are written
    in the transactions that move the canary, so the start cannot drift from the history, and a
    promotion or a rejected lineage starts the next lineage's clock with no extra bookkeeping
    (its versions are new, or newer than the promoted one, so none of them was a canary before).
    """
    lineage = lineage_versions(await versions_of(connection, policy, (*LINEAGE_STATUSES, VersionStatus.PROMOTED)))
    if not lineage:
        return None
    started: datetime | None = (
        await connection.execute(
            select(func.min(adapter_transitions.c.created_at)).where(
                adapter_transitions.c.adapter_version_id.in_([v.id for v in lineage]),
                adapter_transitions.c.to_status == VersionStatus.CANARY.value,
            )
        )
    ).scalar()
    return started


async def transitions_of(connection: AsyncConnection, version_id: uuid.UUID) -> list[Transition]:
    rows = await connection.execute(
        select(adapter_transitions)
        .where(adapter_transitions.c.adapter_version_id == version_id)
        .order_by(adapter_transitions.c.id)
    )
    return [Transition.from_row(row) for row in rows]


# ---------------------------------------------------------------- a new candidate (the learner)


@dataclass(frozen=True)
class NewCandidate:
    """What a finished training run knows about the adapter it saved."""

    id: uuid.UUID
    policy: str
    version: int
    name: str
    base_model: str
    path: str
    parent_version_id: uuid.UUID | None  # the promoted version training continued from
    training_run_id: uuid.UUID
    rank: int
    alpha: float
    target_modules: list[str]


def candidate_rows(candidate: NewCandidate) -> tuple[Insert, Insert]:
    """The version row (status candidate) and its first transition row (NULL -> candidate, "auto")."""
    version = insert(adapter_versions).values(
        id=candidate.id,
        policy=candidate.policy,
        version=candidate.version,
        name=candidate.name,
        status=VersionStatus.CANDIDATE.value,
        base_model=candidate.base_model,
        path=candidate.path,
        parent_version_id=candidate.parent_version_id,
        training_run_id=candidate.training_run_id,
        rank=candidate.rank,
        alpha=candidate.alpha,
        target_modules=sorted(candidate.target_modules),
    )
    first_transition = insert(adapter_transitions).values(
        adapter_version_id=candidate.id,
        policy=candidate.policy,
        from_status=None,
        to_status=VersionStatus.CANDIDATE.value,
        actor="auto",
        reason=f"trained by learner run {candidate.training_run_id}",
    )
    return version, first_transition


def record_candidate(connection: psycopg.Connection[Any], candidate: NewCandidate) -> None:
    """Write a new candidate's rows on the learner's connection, inside the transaction it has open.

    The learner commits these rows together with marking the trajectories it trained on and
    finishing its run row, so a run killed before its commit leaves no trace of any of them.
    """
    for statement in candidate_rows(candidate):
        _execute_on_psycopg(connection, statement)


def next_version_number(connection: psycopg.Connection[Any], policy: str) -> int:
    """The number the policy's next version gets (its LoRA name is `<policy>-v<number>`)."""
    query = select(func.coalesce(func.max(adapter_versions.c.version), 0) + 1).where(
        adapter_versions.c.policy == policy
    )
    row = _execute_on_psycopg(connection, query).fetchone()
    assert row is not None  # an aggregate always answers one row
    return int(row[0])


_PSYCOPG = psycopg_dialect.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves it unannotated


def _execute_on_psycopg(connection: psycopg.Connection[Any], statement: ClauseElement) -> psycopg.Cursor[Any]:
    """Run a SQLAlchemy Core statement on a plain psycopg connection, with SQLAlchemy's own
    conversion of each parameter for psycopg (a JSONB value becomes `Jsonb(...)`)."""
    compiled = cast(SQLCompiler, statement.compile(dialect=_PSYCOPG))
    parameters = {}
    for name, value in compiled.params.items():
        convert = compiled.binds[name].type.dialect_impl(_PSYCOPG).bind_processor(_PSYCOPG)
        parameters[name] = convert(value) if convert is not None else value
    return connection.execute(str(compiled), parameters)


# ---------------------------------------------------------------- transitions


async def _record(
    connection: AsyncConnection,
    version: AdapterVersion,
    to_status: VersionStatus,
    actor: str,
    reason: str | None,
    values: dict[str, Any] | None = None,
) -> AdapterVersion:
    updated = (
        await connection.execute(
            update(adapter_versions)
            .where(adapter_versions.c.id == version.id)
            .values(status=to_status.value, updated_at=func.now(), **(values or {}))
            .returning(*adapter_versions.c)
        )
    ).one()
    await connection.execute(
        insert(adapter_transitions).values(
            adapter_version_id=version.id,
            policy=version.policy,
            from_status=version.status.value,
            to_status=to_status.value,
            actor=actor,
            reason=reason,
        )
    )
    await connection.execute(
        text("SELECT pg_notify(:channel, :policy)"), {"channel": NOTIFY_CHANNEL, "policy": version.policy}
    )
    return AdapterVersion.from_row(updated)


async def _policy_of(engine: AsyncEngine, version_id: uuid.UUID) -> str:
    async with engine.connect() as connection:
        return (await get_version(connection, version_id)).policy


def _values_for(
    to_status: VersionStatus, canary_share: float | None, evaluation: dict[str, Any] | None
) -> dict[str, Any]:
    """The columns besides the status that a transition to `to_status` sets."""
    if to_status is VersionStatus.CANARY:
        return {"canary_share": canary_share, **({"evaluation": evaluation} if evaluation is not None else {})}
    if to_status is VersionStatus.PROMOTED:
        return {"canary_share": None}
    return {}


async def transition(
    engine: AsyncEngine,
    version_id: uuid.UUID,
    to_status: VersionStatus,
    *,
    actor: str,
    reason: str | None = None,
    from_statuses: Iterable[VersionStatus] | None = None,
    canary_share: float | None = None,
    evaluation: dict[str, Any] | None = None,
    prepare: Prepare | None = None,
) -> TransitionResult:
    """Move a version to `to_status` (canary, promoted or rejected) in one locked transaction.

    `from_statuses` narrows the allowed origins (the periodic job promotes only canaries, a
    rollback only retired versions). Promotion retires the version promoted before; a
    canary start refuses while another canary of the policy runs.

    `prepare(version)` runs under the policy lock after every check and before the update
    (`serving` loads the adapter at every endpoint there): if it raises, nothing changes.
    Holding the lock across it means the reconciler cannot unload the adapter between the
    load and the commit.
    """
    if to_status not in (VersionStatus.CANARY, VersionStatus.PROMOTED, VersionStatus.REJECTED):
        raise ValueError(f"no transition function for {to_status!r}")
    allowed = ALLOWED[to_status] if from_statuses is None else ALLOWED[to_status] & frozenset(from_statuses)
    policy = await _policy_of(engine, version_id)
    async with engine.begin() as connection:
        await lock_policy(connection, policy)
        version = await get_version(connection, version_id, lock=True)
        if version.status == to_status:
            return TransitionResult(version, changed=False, from_status=to_status)
        if version.status not in allowed:
            raise refusal(version, to_status, allowed)
        if to_status.serving and (deleted := files_deleted(version)) is not None:
            raise deleted
        serving = await serving_versions(connection, policy)
        if to_status is VersionStatus.CANARY and serving.canary is not None:
            raise TransitionError(
                f"policy {policy!r} already has a canary ({serving.canary.name}): promote or reject it first",
                current=version.status,
            )
        prepared = await prepare(version) if prepare is not None else None
        side: list[AdapterVersion] = []
        if to_status is VersionStatus.PROMOTED and serving.promoted is not None:
            side.append(
                await _record(
                    connection,
                    serving.promoted,
                    VersionStatus.RETIRED,
                    actor,
                    f"replaced by {version.name}" + (f": {reason}" if reason else ""),
                )
            )
        if to_status is VersionStatus.PROMOTED and version.status is VersionStatus.RETIRED:
            # A rollback: the versions newer than the one that serves again descend from the
            # line given up on; left as candidates they would be the lineage the learner continues.
            for newer in await versions_of(connection, policy, LINEAGE_STATUSES):
                if newer.version > version.version:
                    side.append(
                        await _record(
                            connection,
                            newer,
                            VersionStatus.REJECTED,
                            actor,
                            f"lineage given up: rolled back to {version.name}",
                        )
                    )
        updated = await _record(
            connection, version, to_status, actor, reason, _values_for(to_status, canary_share, evaluation)
        )
    return TransitionResult(updated, changed=True, from_status=version.status, side_effects=side, prepared=prepared)


async def supersede_canary(
    engine: AsyncEngine, version_id: uuid.UUID, *, actor: str, reason: str | None = None, prepare: Prepare | None = None
) -> TransitionResult:
    """Move the canary on to a newer version of its lineage, in one locked transaction.

    The newer version (a candidate) becomes the canary with the old canary's share; the old
    canary goes back to candidate ("superseded": it stays in the lineage, as the parent of what
    followed). Both changes get their `adapter_transitions` row. With no canary, or a canary that
    is not older, it raises instead of starting one: two processes racing to start and to move
    a canary cannot both succeed. `prepare(version)` loads the newer adapter before anything
    changes.
    """
    policy = await _policy_of(engine, version_id)
    async with engine.begin() as connection:
        await lock_policy(connection, policy)
        version = await get_version(connection, version_id, lock=True)
        if version.status is VersionStatus.CANARY:
            return TransitionResult(version, changed=False, from_status=version.status)
        if version.status is not VersionStatus.CANDIDATE:
            raise refusal(version, VersionStatus.CANARY, {VersionStatus.CANDIDATE})
        if (deleted := files_deleted(version)) is not None:
            raise deleted
        old = (await serving_versions(connection, policy)).canary
        if old is None:
            raise TransitionError(
                f"policy {policy!r} has no canary for {version.name} to supersede", current=version.status
            )
        if old.version >= version.version:
            raise TransitionError(f"{version.name} is not newer than the canary {old.name}", current=version.status)
        prepared = await prepare(version) if prepare is not None else None
        retired = await _record(connection, old, VersionStatus.CANDIDATE, actor, f"superseded by {version.name}")
        updated = await _record(
            connection,
            version,
            VersionStatus.CANARY,
            actor,
            reason,
            {"canary_share": old.canary_share, "evaluation": old.evaluation},
        )
    return TransitionResult(
        updated, changed=True, from_status=version.status, side_effects=[retired], prepared=prepared
    )


async def reject_lineage(engine: AsyncEngine, policy: str, *, actor: str, reason: str) -> list[AdapterVersion]:
    """Reject every version of the live lineage (candidates and the canary newer than the
    promoted version) in one locked transaction, all with one reason; returns them.

    The lineage head then falls back to the promoted version, so the learner's next run starts
    from it again (see `lineage`)."""
    async with engine.begin() as connection:
        await lock_policy(connection, policy)
        lineage = lineage_versions(await versions_of(connection, policy, (*LINEAGE_STATUSES, VersionStatus.PROMOTED)))
        return [await _record(connection, version, VersionStatus.REJECTED, actor, reason) for version in lineage]


async def start_canary(
    engine: AsyncEngine,
    version_id: uuid.UUID,
    *,
    actor: str,
    share: float,
    reason: str | None = None,
    evaluation: dict[str, Any] | None = None,
    prepare: Prepare | None = None,
) -> TransitionResult:
    return await transition(
        engine,
        version_id,
        VersionStatus.CANARY,
        actor=actor,
        reason=reason,
        canary_share=share,
        evaluation=evaluation,
        prepare=prepare,
    )


async def promote(
    engine: AsyncEngine,
    version_id: uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
    from_statuses: Iterable[VersionStatus] | None = None,
    prepare: Prepare | None = None,
) -> TransitionResult:
    return await transition(
        engine,
        version_id,
        VersionStatus.PROMOTED,
        actor=actor,
        reason=reason,
        from_statuses=from_statuses,
        prepare=prepare,
    )


async def reject(
    engine: AsyncEngine,
    version_id: uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
    from_statuses: Iterable[VersionStatus] | None = None,
) -> TransitionResult:
    return await transition(
        engine, version_id, VersionStatus.REJECTED, actor=actor, reason=reason, from_statuses=from_statuses
    )


async def rollback(
    engine: AsyncEngine, version_id: uuid.UUID, *, actor: str, reason: str | None = None
) -> TransitionResult:
    """Make a retired version promoted again (the promoted one is retired)."""
    return await transition(
        engine,
        version_id,
        VersionStatus.PROMOTED,
        actor=actor,
        reason=reason or "rollback",
        from_statuses=(VersionStatus.RETIRED,),
    )


# ---------------------------------------------------------------- documents and policy state


async def update_jsonb(
    engine: AsyncEngine, version_id: uuid.UUID, column: Literal["gates", "evaluation"], value: dict[str, Any]
) -> None:
    """Replace the `gates` or `evaluation` document of a version (no status change)."""
    if column not in ("gates", "evaluation"):
        raise ValueError(column)
    async with engine.begin() as connection:
        await connection.execute(
            update(adapter_versions)
            .where(adapter_versions.c.id == version_id)
            .values({column: value, "updated_at": func.now()})
        )


async def set_learning_paused(engine: AsyncEngine, policy: str, paused: bool, *, actor: str) -> PolicyState:
    """Pause or resume learning for a policy (idempotent: an unchanged state keeps who set it)."""
    async with engine.begin() as connection:
        row = (
            await connection.execute(
                text(
                    "INSERT INTO policy_state (policy, learning_paused, updated_by, updated_at) "
                    "VALUES (:p, :paused, :actor, now()) ON CONFLICT (policy) DO UPDATE "
                    "SET learning_paused = excluded.learning_paused, updated_by = excluded.updated_by, "
                    "updated_at = now() "
                    "WHERE policy_state.learning_paused IS DISTINCT FROM excluded.learning_paused "
                    "RETURNING policy, learning_paused, updated_by, updated_at"
                ),
                {"p": policy, "paused": paused, "actor": actor},
            )
        ).first()
        if row is None:  # already in that state: nothing written
            row = (await connection.execute(select(policy_state).where(policy_state.c.policy == policy))).one()
    return PolicyState.from_row(row)


async def policy_states(connection: AsyncConnection) -> dict[str, PolicyState]:
    """Every policy_state row by policy (a policy without one was never paused)."""
    return {row.policy: PolicyState.from_row(row) for row in await connection.execute(select(policy_state))}
