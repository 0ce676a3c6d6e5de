"""Make the endpoints and the adapter store hold what serves, as the database says.

Steps 3 and 4 of the promotion tick, also callable alone: serving versions an endpoint lost
(a restarted server, a new replica) are loaded again and those that stopped serving are
unloaded after `unload_grace_s` (`reconcile`); every serving version is published to the
policy's adapter store (`adapter_store`, for vLLM's filesystem LoRA resolver) and the copies
of those that stopped serving are removed after the same grace (`sync_adapter_store`).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.discovery.directory import current_endpoints
from apprentice.promotion import lifecycle, loading
from apprentice.promotion.adapter_store import AdapterStore, PublishError
from apprentice.promotion.clock import database_now
from apprentice.promotion.object_store import ObjectStore
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus
from apprentice.promotion.tick_report import TickReport
from apprentice.settings import EndpointDiscoverySettings, PolicySettings, resolve_secret

__all__ = ["reconcile", "sync_adapter_store"]


async def reconcile(
    engine: AsyncEngine,
    policy: PolicySettings,
    *,
    report: TickReport | None = None,
    client: httpx.AsyncClient | None = None,
    now: datetime | None = None,
    discovery: EndpointDiscoverySettings | None = None,
) -> TickReport:
    """Load serving versions where an endpoint lost them (a restarted server, or a new replica
    a DNS entry resolves to now); unload the others (retired, rejected, superseded canaries)
    after the grace. `now` is on the database's clock (`database_now`): the grace is measured
    from transitions the database time-stamped. `discovery`: how DNS entries are resolved."""
    report = report or TickReport()
    endpoints, unresolved = await current_endpoints(discovery or EndpointDiscoverySettings(), policy)
    report.errors.extend(f"{policy.name}: endpoint {name} has not resolved to any address" for name in unresolved)
    if not endpoints:
        return report
    now = now or await database_now(engine)
    api_key = resolve_secret(policy.api_key)
    versions, last = await _versions_and_last_changes(engine, policy.name)
    loaded = await loading.loaded_at(endpoints, api_key=api_key, client=client)
    for endpoint, models in loaded.items():
        if isinstance(models, str):
            report.errors.append(f"{policy.name}: {endpoint} did not list its models: {models}")
            continue
        for version in versions:
            if version.status.serving and version.name not in models:
                try:
                    await loading.ensure_loaded([endpoint], version.name, version.path, api_key=api_key, client=client)
                    report.add(policy.name, version.name, "reloaded", f"{endpoint} had lost it")
                except loading.LoadError as exc:
                    report.errors.append(f"{policy.name}: {exc}")
            elif not version.status.serving and version.name in models:
                if _past_grace(policy, version, last, now):
                    await _unload_unless_serving(engine, policy, version, endpoint, api_key, client, report)
    return report


async def _versions_and_last_changes(
    engine: AsyncEngine, policy: str
) -> tuple[list[AdapterVersion], dict[uuid.UUID, datetime]]:
    """Every version of the policy (every status: a canary the lineage moved past is a candidate
    again, still served until the grace ends) and when each last changed status."""
    async with engine.connect() as connection:
        versions = await lifecycle.versions_of(connection, policy, tuple(VersionStatus))
        last = await lifecycle.last_status_changes(connection, policy)
    return versions, last


def _past_grace(
    policy: PolicySettings, version: AdapterVersion, last: dict[uuid.UUID, datetime], now: datetime
) -> bool:
    """Whether a version that stopped serving did so at least `unload_grace_s` ago."""
    changed_at = last.get(version.id) or version.updated_at
    return (now - changed_at).total_seconds() >= policy.promotion.unload_grace_s


async def sync_adapter_store(
    engine: AsyncEngine, policy: PolicySettings, *, report: TickReport | None = None, now: datetime | None = None
) -> TickReport:
    """Make the policy's adapter store hold exactly what serves (plus what is in its grace).

    Serving versions missing from the store (published by a process without the files, a
    wiped volume, a store configured after they started serving) are published; versions that
    stopped serving are removed `unload_grace_s` after their last transition, as the endpoints
    unload them; temporary directories a killed publisher left are swept. `now` is on the
    database's clock (`database_now`)."""
    report = report or TickReport()
    store = AdapterStore.for_policy(policy)
    if store is None:
        return report
    now = now or await database_now(engine)
    versions, last = await _versions_and_last_changes(engine, policy.name)
    objects = ObjectStore.for_policy(policy)
    try:
        uploaded = await asyncio.to_thread(objects.names) if objects is not None else set()
    except Exception as exc:  # the bucket did not answer: the directory store is kept in step all the same
        report.errors.append(f"{policy.name}: adapter store {objects.url if objects else ''}: {exc}")
        objects, uploaded = None, set()
    for version in versions:
        try:
            if version.status.serving:
                outcome = await asyncio.to_thread(store.publish, version.name, version.path, version.id)
                if outcome != "present":
                    report.add(policy.name, version.name, "published", f"{store.location(version.name)} ({outcome})")
                if objects is not None:
                    location = store.location(version.name)
                    if await asyncio.to_thread(objects.upload, version.name, location) != "present":
                        report.add(policy.name, version.name, "uploaded", objects.key(version.name))
            elif _past_grace(policy, version, last, now) and (
                version.name in uploaded or await asyncio.to_thread(store.holds, version.name)
            ):
                await _unpublish_unless_serving(engine, store, objects, version, report)
        except (PublishError, ValueError) as exc:  # ValueError: a name the store cannot hold (location)
            report.errors.append(f"{policy.name}: {exc}")
    for leftover in await asyncio.to_thread(store.sweep):
        report.add(policy.name, None, "store_swept", str(leftover))
    return report


async def _unpublish_unless_serving(
    engine: AsyncEngine, store: AdapterStore, objects: ObjectStore | None, version: AdapterVersion, report: TickReport
) -> None:
    """Remove a version's published copy under the policy lock, after re-reading its status: a
    rollback that publishes it again waits for the lock and then publishes it anew."""
    async with engine.begin() as connection:
        await lifecycle.lock_policy(connection, version.policy)
        current = await lifecycle.get_version(connection, version.id)
        if current.status.serving:
            return
        if await asyncio.to_thread(store.remove, version.name):
            where = f"{store.location(version.name)} ({current.status})"
            report.add(version.policy, version.name, "unpublished", where)
        if objects is not None and await asyncio.to_thread(objects.remove, version.name):
            report.add(version.policy, version.name, "unpublished", f"{objects.url}/{version.name} ({current.status})")


async def _unload_unless_serving(
    engine: AsyncEngine,
    policy: PolicySettings,
    version: AdapterVersion,
    endpoint: str,
    api_key: str | None,
    client: httpx.AsyncClient | None,
    report: TickReport,
) -> None:
    """Unload under the policy lock, after re-reading the status: a rollback that loads the same
    version waits for the lock and then finds it gone (and loads it again) instead of
    committing a promotion of an adapter this unload removes behind its back."""
    async with engine.begin() as connection:
        await lifecycle.lock_policy(connection, policy.name)
        current = await lifecycle.get_version(connection, version.id)
        if current.status.serving:
            return
        try:
            await loading.unload([endpoint], version.name, api_key=api_key, client=client)
            report.add(policy.name, version.name, "unloaded", f"{endpoint} ({current.status})")
        except loading.LoadError as exc:
            report.errors.append(f"{policy.name}: {exc}")
