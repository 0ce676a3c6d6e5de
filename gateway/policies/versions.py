"""Which adapter version serves a policy's call: the canary's share, the promoted version
otherwise, and the base model while nothing is promoted.

Every gateway process re-reads the serving versions when the lifecycle announces a transition
(NOTIFY, see notifications.py: a few milliseconds after the commit) and polls them anyway (one
small query a second), so that a missed notification or a status changed by hand costs at most
a second. No restart, and calls in flight are not touched. The request path only reads this
process's memory.

Stickiness: a trajectory stays on the version that served its first call. Calls of one run
share the messages before the first assistant turn, so the canary split hashes that prefix
(or the client's trajectory id): every process and replica puts a run's calls on the same
version with no shared state. The stitch index also remembers the version of each open
trajectory, so a run keeps its version across a transition while it stays on one process.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion.status import SERVING, VersionStatus
from apprentice.store.tables import adapter_versions
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

SERVING_STATUSES = tuple(sorted(status.value for status in SERVING))


@dataclass(frozen=True, slots=True)
class ServingVersion:
    id: uuid.UUID
    name: str  # the LoRA name the inference endpoints serve it under


@dataclass(frozen=True, slots=True)
class PolicyServing:
    promoted: ServingVersion | None = None
    canary: ServingVersion | None = None
    canary_share: float = 0.0

    def is_serving(self, version_id: uuid.UUID | None) -> bool:
        if version_id is None:
            return self.promoted is None
        return any(v is not None and v.id == version_id for v in (self.promoted, self.canary))

    def by_id(self, version_id: uuid.UUID | None) -> ServingVersion | None:
        for version in (self.promoted, self.canary):
            if version is not None and version.id == version_id:
                return version
        return None


def bucket(key: bytes) -> float:
    """A uniform number in [0, 1): the same key lands in the same arm everywhere.

    The key is hashed first: a split key may be a gateway-issued UUIDv7, whose leading bytes
    are a timestamp, and reading those directly put every echoed run in the canary."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


class PolicyVersions:
    def __init__(self, engine: AsyncEngine, *, poll_interval_s: float) -> None:
        self.engine = engine
        self.poll_interval_s = poll_interval_s
        self._serving: dict[str, PolicyServing] = {}
        self.loaded = asyncio.Event()
        self.worker = PeriodicWorker("adapter-version-poll", self.refresh, interval_s=poll_interval_s)

    async def start(self) -> None:
        """Read the serving versions before serving; if the store does not answer, serve the
        base model and let the worker retry (with back-off) in the background."""
        await self.worker.run_once()
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()

    def wake(self) -> None:
        """Re-read the serving versions now (a transition was announced by NOTIFY)."""
        self.worker.wake()

    async def refresh(self) -> None:
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                select(adapter_versions.c.policy, adapter_versions.c.id, adapter_versions.c.name,
                       adapter_versions.c.status, adapter_versions.c.canary_share)
                .where(adapter_versions.c.status.in_(SERVING_STATUSES)))
            serving: dict[str, dict[str, object]] = {}
            for row in rows:
                entry = serving.setdefault(row.policy, {})
                version = ServingVersion(row.id, row.name)
                if row.status == VersionStatus.PROMOTED:
                    entry["promoted"] = version
                else:
                    entry["canary"] = version
                    entry["canary_share"] = float(row.canary_share or 0.0)
        self._serving = {policy: PolicyServing(**entry) for policy, entry in serving.items()}  # type: ignore[arg-type]
        self.loaded.set()

    def serving(self, policy: str) -> PolicyServing:
        return self._serving.get(policy) or PolicyServing()

    def choose(self, policy: str, split_key: bytes, sticky_version: uuid.UUID | None,
               sticky_known: bool) -> ServingVersion | None:
        """The version for a call; None means the base model."""
        serving = self.serving(policy)
        if sticky_known and serving.is_serving(sticky_version):
            return serving.by_id(sticky_version)
        if serving.canary is not None and bucket(split_key) < serving.canary_share:
            return serving.canary
        return serving.promoted
