"""The transitions that make a version serve: canary start, canary move, promotion.

Every action that makes a version serve (canary start, promotion, rollback) first loads the
adapter into every inference endpoint of the policy (`loading.ensure_loaded`: idempotent,
retried, verified with GET /models) and only then commits the status change
(`lifecycle`), so a gateway never routes a call to a name an endpoint does not serve. A
version that stops serving (retired, rejected) stays loaded for `unload_grace_s`, so calls
in flight and gateways that have not polled yet keep working; the reconciler (`reconcile`)
unloads it afterwards.

With an adapter store, every action that makes a version serve publishes it there before any
endpoint loads it, so a replica the promotion job never called (started later, or not in
`endpoints`) finds it on first request. A process that cannot see the version's files (a
gateway without the adapters volume, acting for an admin) leaves publishing to the promotion
job's next tick.

Both the admin actions (`actions`) and the periodic job (`tick`) make versions serve through
these functions; neither imports the other.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.discovery.directory import current_endpoints
from apprentice.evalsets.gate import require_eval_gate
from apprentice.promotion import evaluation as ev
from apprentice.promotion import lifecycle, loading
from apprentice.promotion.adapter_store import AdapterStore, PublishError
from apprentice.promotion.gate_checks import require_gates
from apprentice.promotion.gates import GateReport
from apprentice.promotion.lifecycle import TransitionError, TransitionResult
from apprentice.promotion.object_store import ObjectStore
from apprentice.promotion.policies import policy_settings
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus
from apprentice.settings import PolicySettings, Settings, resolve_secret

log = logging.getLogger(__name__)

__all__ = ["ActionResult", "precheck", "promote", "start_canary", "supersede_canary"]

CANDIDATE, CANARY, PROMOTED = VersionStatus.CANDIDATE, VersionStatus.CANARY, VersionStatus.PROMOTED


@dataclass
class ActionResult:
    transition: TransitionResult
    endpoints: list[loading.EndpointOutcome] = field(default_factory=list)
    gates: GateReport | None = None


async def _load(
    settings: Settings, policy: PolicySettings, version: AdapterVersion, client: httpx.AsyncClient | None
) -> list[loading.EndpointOutcome]:
    if (deleted := lifecycle.files_deleted(version)) is not None:
        raise deleted
    endpoints, unresolved = await current_endpoints(settings.endpoint_discovery, policy)
    if not endpoints and unresolved:  # not the adapter's fault: the next tick retries, nothing is rejected
        raise loading.LoadError(version.name, dict.fromkeys(unresolved, "the DNS name has not resolved to any address"))
    await _publish(policy, version)
    return await loading.ensure_loaded(
        endpoints, version.name, version.path, api_key=resolve_secret(policy.api_key), client=client
    )


async def _publish(policy: PolicySettings, version: AdapterVersion) -> None:
    """Publish `version` to the policy's adapter store, if it has one, before it serves.

    A process that does not see the version's files (a gateway acting for an admin, without the
    adapters volume, whether or not it mounts the store) skips: the promotion job publishes every serving
    version missing from the store at its next tick (`reconcile.sync_adapter_store`). Files that are
    there but not whole raise PublishError: nothing corrupt is published or served."""
    store = AdapterStore.for_policy(policy)
    if store is None:
        return
    if not await asyncio.to_thread(Path(version.path).exists):
        log.info("promotion: %s not published from this process (no view of its files); left to the tick", version.name)
        return
    try:
        await asyncio.to_thread(store.publish, version.name, version.path, version.id)
    except ValueError as exc:  # a version name the store cannot hold as a directory (AdapterStore.location)
        raise PublishError(version.name, store.root, str(exc), permanent=True) from exc
    if (objects := ObjectStore.for_policy(policy)) is not None:
        await asyncio.to_thread(objects.upload, version.name, store.location(version.name))


def precheck(
    version: AdapterVersion, to_status: VersionStatus, from_statuses: tuple[VersionStatus, ...] | None = None
) -> bool:
    """True when there is something to do; TransitionError when it is not allowed (before loading)."""
    if version.status == to_status:
        return False
    allowed = lifecycle.ALLOWED[to_status] & frozenset(from_statuses or lifecycle.ALLOWED[to_status])
    if version.status not in allowed:
        raise lifecycle.refusal(version, to_status, allowed)
    return True


def _unchanged(version: AdapterVersion) -> ActionResult:
    return ActionResult(TransitionResult(version, changed=False, from_status=version.status))


async def start_canary(
    engine: AsyncEngine,
    settings: Settings,
    version: AdapterVersion,
    *,
    actor: str,
    reason: str | None,
    client: httpx.AsyncClient | None,
    force: bool = False,
    files: bool = False,
) -> ActionResult:
    if not precheck(version, CANARY):
        return _unchanged(version)
    policy = policy_settings(settings, version.policy)
    gates = await require_gates(engine, settings, version, force=force, files=files)
    async with engine.connect() as connection:
        serving = await lifecycle.serving_versions(connection, version.policy)
    if serving.canary is not None:
        raise TransitionError(
            f"policy {version.policy!r} already has a canary ({serving.canary.name}): promote or reject it first",
            current=version.status,
        )
    if not force:  # the version about to serve, scored on the evaluation set against the promoted one
        await require_eval_gate(engine, settings, policy, version, client=client)
    incumbent = serving.promoted
    evaluation = {
        "incumbent_version_id": str(incumbent.id) if incumbent else None,
        "incumbent_name": incumbent.name if incumbent else None,
        "verdict": ev.INSUFFICIENT,
    }

    async def load(locked: AdapterVersion) -> list[loading.EndpointOutcome]:
        return await _load(settings, policy, locked, client)

    result = await lifecycle.start_canary(
        engine,
        version.id,
        actor=actor,
        share=policy.promotion.canary_share,
        reason=reason,
        evaluation=evaluation,
        prepare=load,
    )
    return ActionResult(result, result.prepared or [], gates)


async def supersede_canary(
    engine: AsyncEngine,
    settings: Settings,
    version: AdapterVersion,
    *,
    actor: str,
    reason: str,
    client: httpx.AsyncClient | None,
) -> ActionResult:
    """Load a newer lineage version at every endpoint, then make it the canary in place of the
    current one (which goes back to candidate; it stays loaded until the reconciler's grace)."""
    policy = policy_settings(settings, version.policy)
    await require_eval_gate(engine, settings, policy, version, client=client)

    async def load(locked: AdapterVersion) -> list[loading.EndpointOutcome]:
        return await _load(settings, policy, locked, client)

    result = await lifecycle.supersede_canary(engine, version.id, actor=actor, reason=reason, prepare=load)
    return ActionResult(result, result.prepared or [])


async def promote(
    engine: AsyncEngine,
    settings: Settings,
    version: AdapterVersion,
    *,
    actor: str,
    reason: str | None,
    client: httpx.AsyncClient | None,
    from_statuses: tuple[VersionStatus, ...] | None = None,
    force: bool = False,
) -> ActionResult:
    if not precheck(version, PROMOTED, from_statuses):
        return _unchanged(version)
    policy = policy_settings(settings, version.policy)
    gates = None
    if version.status == CANDIDATE:
        gates = await require_gates(engine, settings, version, force=force, hint=" (promote with force to override)")

    async def load(locked: AdapterVersion) -> list[loading.EndpointOutcome]:
        return await _load(settings, policy, locked, client)

    result = await lifecycle.promote(
        engine, version.id, actor=actor, reason=reason, from_statuses=from_statuses, prepare=load
    )
    return ActionResult(result, result.prepared or [], gates)
