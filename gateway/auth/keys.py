"""Gateway API keys: made by the CLI, stored as sha256 hashes, checked from a memory cache.

The request path never waits on the database for a known key: all active keys are loaded
at start and refreshed in the background (so a revocation takes effect within the refresh
interval). Only an unknown key costs one lookup, and a miss is remembered briefly.

A key's own rate limits (`api_keys.limits`, docs/limits.md) travel with it in the cache, so
the limiter reads them from memory too; a change reaches every gateway within the same
refresh interval as a revocation.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import RateLimits
from apprentice.store.tables import api_keys
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

KEY_PREFIX = "apk-"
DISPLAY_PREFIX_CHARS = 12
NEGATIVE_TTL_S = 5.0


@dataclass(frozen=True, slots=True)
class KeyInfo:
    id: uuid.UUID | None
    name: str
    tenant: str
    role: str  # "client" or "admin"
    # The key's own limits (RateLimits fields it sets; absent ones fall back to the configured
    # default, a null lifts that limit); empty: the defaults.
    limits: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # The key opted out of training (api_keys.training_opt_out), as of the cache's last refresh:
    # exploration skips its calls (the shipper reads the flag itself for what trains).
    training_opt_out: bool = False

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def parse_limits(value: Any) -> dict[str, Any]:
    """A key's limits as given (CLI, admin API, the stored JSON): only RateLimits' fields, checked.

    Raises ValueError with pydantic's message when a field is unknown or out of range."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("limits must be a JSON object")
    try:
        checked = RateLimits.model_validate(dict(value))
    except ValidationError as exc:
        raise ValueError(str(exc)) from None
    return checked.model_dump(include=set(value))


def read_limits(value: Any) -> tuple[dict[str, Any], str | None]:
    """A stored row's limits as the gateways apply them, and why they are ignored (None: valid).

    Reading a row never fails on its content: limits written by hand in SQL (an unknown field, a
    number out of range) leave the key on the defaults, and a listing reports the reason."""
    try:
        return parse_limits(value), None
    except ValueError as exc:
        return {}, str(exc)


def _stored_limits(value: Any, name: str) -> dict[str, Any]:
    limits, invalid = read_limits(value)
    if invalid is not None:  # the key keeps working on the defaults
        log.warning("api key %s: ignoring invalid limits: %s", name, invalid)
    return limits


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


async def create_key(
    engine: AsyncEngine, *, name: str, tenant: str, role: str = "client", limits: Mapping[str, Any] | None = None
) -> tuple[KeyInfo, str]:
    """Create a key; the clear key is returned once and never stored."""
    if role not in ("client", "admin"):
        raise ValueError("role must be 'client' or 'admin'")
    checked = parse_limits(limits)
    key = generate_key()
    info = KeyInfo(id=uuid.uuid4(), name=name, tenant=tenant, role=role, limits=checked)
    async with engine.begin() as connection:
        await connection.execute(
            insert(api_keys).values(
                id=info.id,
                name=name,
                tenant=tenant,
                role=role,
                key_hash=hash_key(key),
                key_prefix=key[:DISPLAY_PREFIX_CHARS],
                limits=checked,
            )
        )
    return info, key


def _key_condition(key_id_or_prefix: str) -> Any:
    try:
        return api_keys.c.id == uuid.UUID(key_id_or_prefix)
    except ValueError:
        return api_keys.c.key_prefix == key_id_or_prefix


async def set_key_limits(
    engine: AsyncEngine, key_id_or_prefix: str, limits: Mapping[str, Any], *, replace: bool = False
) -> dict[str, Any] | None:
    """Set some of an active key's limits (`replace`: the whole set); returns the key's limits
    now, or None when no active key matches. Gateways apply them within key_cache_ttl_s."""
    checked = parse_limits(limits)
    async with engine.begin() as connection:
        row = (
            await connection.execute(
                select(api_keys.c.id, api_keys.c.limits)
                .where(_key_condition(key_id_or_prefix), api_keys.c.revoked_at.is_(None))
                .with_for_update()
            )
        ).first()
        if row is None:
            return None
        updated = checked if replace else {**(row.limits or {}), **checked}
        await connection.execute(update(api_keys).where(api_keys.c.id == row.id).values(limits=updated))
    return updated


async def revoke_key(engine: AsyncEngine, key_id_or_prefix: str) -> int:
    condition = _key_condition(key_id_or_prefix)
    async with engine.begin() as connection:
        result = await connection.execute(
            update(api_keys).where(condition, api_keys.c.revoked_at.is_(None)).values(revoked_at=func.now())
        )
    return result.rowcount


async def list_keys(engine: AsyncEngine) -> list[dict[str, object]]:
    """Every key, its limits as applied (`read_limits`) and `invalid_limits`: why stored ones are not."""
    async with engine.connect() as connection:
        rows = await connection.execute(
            select(
                api_keys.c.id,
                api_keys.c.name,
                api_keys.c.tenant,
                api_keys.c.role,
                api_keys.c.key_prefix,
                api_keys.c.created_at,
                api_keys.c.revoked_at,
                api_keys.c.limits,
                api_keys.c.training_opt_out,
            ).order_by(api_keys.c.created_at)
        )
        listed: list[dict[str, object]] = []
        for row in rows:
            limits, invalid = read_limits(row.limits)
            listed.append({**row._mapping, "limits": limits, "invalid_limits": invalid})
        return listed


class KeyCache:
    """Maps key hashes to KeyInfo; also knows the configured admin key."""

    def __init__(self, engine: AsyncEngine | None, *, admin_key: str | None, refresh_s: float) -> None:
        self.engine = engine
        self.refresh_s = refresh_s
        self._admin_hash = hash_key(admin_key) if admin_key else None
        self._keys: dict[bytes, KeyInfo] = {}
        self._misses: dict[bytes, float] = {}
        self.worker = PeriodicWorker("api-key-refresh", self.refresh, interval_s=refresh_s)

    async def start(self) -> None:
        """Load the keys before serving; if the store does not answer, serve the admin key and
        let the worker retry (with back-off) in the background."""
        await self.worker.run_once()
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()

    async def refresh(self) -> None:
        if self.engine is None:
            return
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                select(
                    api_keys.c.id,
                    api_keys.c.name,
                    api_keys.c.tenant,
                    api_keys.c.role,
                    api_keys.c.key_hash,
                    api_keys.c.limits,
                    api_keys.c.training_opt_out,
                ).where(api_keys.c.revoked_at.is_(None))
            )
            self._keys = {
                row.key_hash: KeyInfo(
                    row.id,
                    row.name,
                    row.tenant,
                    row.role,
                    _stored_limits(row.limits, row.name),
                    training_opt_out=row.training_opt_out,
                )
                for row in rows
            }
        self._misses.clear()

    async def authenticate(self, key: str) -> KeyInfo | None:
        digest = hash_key(key)
        if self._admin_hash is not None and hmac.compare_digest(digest, self._admin_hash):
            return KeyInfo(id=None, name="admin", tenant="admin", role="admin")
        info = self._keys.get(digest)
        if info is not None:
            return info
        missed_at = self._misses.get(digest)
        if missed_at is not None and time.monotonic() - missed_at < NEGATIVE_TTL_S:
            return None
        info = await self._lookup(digest)
        if info is None:
            if len(self._misses) > 10_000:
                self._misses.clear()
            self._misses[digest] = time.monotonic()
        else:
            self._keys[digest] = info
        return info

    async def _lookup(self, digest: bytes) -> KeyInfo | None:
        if self.engine is None:
            return None
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    select(
                        api_keys.c.id,
                        api_keys.c.name,
                        api_keys.c.tenant,
                        api_keys.c.role,
                        api_keys.c.limits,
                        api_keys.c.training_opt_out,
                    ).where(api_keys.c.key_hash == digest, api_keys.c.revoked_at.is_(None))
                )
            ).first()
        if row is None:
            return None
        return KeyInfo(
            row.id,
            row.name,
            row.tenant,
            row.role,
            _stored_limits(row.limits, row.name),
            training_opt_out=row.training_opt_out,
        )
