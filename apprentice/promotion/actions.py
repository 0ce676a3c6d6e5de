"""What an admin does to a policy's versions: approve, reject, promote now, roll back, pause.

The admin API and the dashboard call these; the periodic job (`tick`) does not, and they do not
call it. The ones that make a version serve go through `serving` (load at every endpoint,
then commit).
"""

from __future__ import annotations

import uuid

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion import lifecycle, serving
from apprentice.promotion.lifecycle import TransitionError, TransitionResult
from apprentice.promotion.policies import policy_settings
from apprentice.promotion.rows import PolicyState
from apprentice.promotion.serving import ActionResult, precheck
from apprentice.promotion.status import VersionStatus
from apprentice.settings import Settings

__all__ = ["approve", "promote_now", "reject", "rollback", "set_paused"]

CANDIDATE, CANARY, PROMOTED = VersionStatus.CANDIDATE, VersionStatus.CANARY, VersionStatus.PROMOTED
RETIRED, REJECTED = VersionStatus.RETIRED, VersionStatus.REJECTED


async def approve(
    engine: AsyncEngine,
    settings: Settings,
    ref: str | uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
    client: httpx.AsyncClient | None = None,
) -> ActionResult:
    """The admin's yes: a candidate becomes the canary, a canary is promoted."""
    version = await lifecycle.find_version(engine, ref)
    if version.status == CANDIDATE:
        return await serving.start_canary(
            engine, settings, version, actor=actor, reason=reason or "approved", client=client
        )
    if version.status in (CANARY, PROMOTED):
        return await serving.promote(
            engine, settings, version, actor=actor, reason=reason or "approved", client=client, from_statuses=(CANARY,)
        )
    raise TransitionError(
        f"adapter version {version.name} is {version.status}: only a candidate or a canary can be approved",
        current=version.status,
    )


async def promote_now(
    engine: AsyncEngine,
    settings: Settings,
    ref: str | uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
    force: bool = False,
    client: httpx.AsyncClient | None = None,
) -> ActionResult:
    """Promote at once, skipping (or cutting short) the canary; a retired version: a rollback."""
    version = await lifecycle.find_version(engine, ref)
    return await serving.promote(
        engine, settings, version, actor=actor, reason=reason or "promoted by an admin", client=client, force=force
    )


async def reject(
    engine: AsyncEngine, settings: Settings, ref: str | uuid.UUID, *, actor: str, reason: str | None = None
) -> ActionResult:
    """The admin's no. Rejecting the canary rejects its whole lineage (the versions it grew
    from and those trained on top of it), as an automatic loss does: the learner starts again
    from the promoted version. Any other version is rejected alone."""
    version = await lifecycle.find_version(engine, ref)
    policy_settings(settings, version.policy)
    precheck(version, REJECTED)
    reason = reason or "rejected"
    if version.status == CANARY:
        rejected = await lifecycle.reject_lineage(engine, version.policy, actor=actor, reason=reason)
        mine = next((v for v in rejected if v.id == version.id), None)
        if mine is not None:
            others = [v for v in rejected if v.id != version.id]
            return ActionResult(TransitionResult(mine, changed=True, from_status=CANARY, side_effects=others))
    return ActionResult(await lifecycle.reject(engine, version.id, actor=actor, reason=reason))


async def rollback(
    engine: AsyncEngine,
    settings: Settings,
    policy: str,
    ref: str | uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
    client: httpx.AsyncClient | None = None,
) -> ActionResult:
    """Promote a retired version of `policy` again; the promoted one is retired."""
    policy_settings(settings, policy)
    version = await lifecycle.find_version(engine, ref, policy=policy)
    return await serving.promote(
        engine, settings, version, actor=actor, reason=reason or "rollback", client=client, from_statuses=(RETIRED,)
    )


async def set_paused(engine: AsyncEngine, settings: Settings, policy: str, paused: bool, *, actor: str) -> PolicyState:
    policy_settings(settings, policy)
    return await lifecycle.set_learning_paused(engine, policy, paused, actor=actor)
