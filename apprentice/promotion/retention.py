"""Retention of adapter files: keep the newest K versions and every version ever promoted.

A version's files are deleted when all of these hold:
- it is not among the policy's newest `keep_last` versions (by version number);
- it was never promoted (no `adapter_transitions` row to 'promoted', and it is not promoted
  or retired now): a rollback can always go back to any version that once served;
- it is in a final status (`rejected`), or a candidate older than the promoted version (a
  version of a lineage that was promoted past it: out of the lineage, it never serves again
  unless an admin asks), so the live lineage and the canary are never touched;
- its last transition is older than `unload_grace_s` (it was unloaded from the endpoints).

The row stays (history, evaluation, transitions); `files_deleted_at` records the deletion
and the lifecycle refuses to serve such a version. Only a directory that holds a PEFT
adapter (`adapter_config.json`) is deleted, never an arbitrary path.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion import lifecycle
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus
from apprentice.store.tables import adapter_transitions, adapter_versions

log = logging.getLogger(__name__)

DELETABLE_STATUSES = frozenset({VersionStatus.REJECTED, VersionStatus.RETIRED})
# A version that serves or once served is kept: a rollback may need it.
EVER_PROMOTED_STATUSES = frozenset({VersionStatus.PROMOTED, VersionStatus.RETIRED})


@dataclass(frozen=True)
class Deletion:
    """What retention did with one version's files: deleted, missing, or refused (and why)."""

    id: uuid.UUID
    name: str
    path: str
    result: str


def plan_retention(
    versions: Iterable[AdapterVersion], keep_last: int, ever_promoted: set[uuid.UUID]
) -> list[AdapterVersion]:
    """The versions whose files should go (pure: no clock, no files)."""
    ordered = sorted(versions, key=lambda v: v.version, reverse=True)
    newest = {v.id for v in ordered[:keep_last]}
    promoted = max((v.version for v in ordered if v.status == VersionStatus.PROMOTED), default=0)
    return [
        v
        for v in ordered
        if v.id not in newest
        and v.id not in ever_promoted
        and v.files_deleted_at is None
        and (v.status in DELETABLE_STATUSES or (v.status == VersionStatus.CANDIDATE and v.version < promoted))
    ]


def delete_adapter_files(path: str) -> str:
    """Delete an adapter directory; returns what happened (deleted, missing, refused: ...)."""
    directory = Path(path)
    if not directory.exists():
        return "missing"
    if not directory.is_dir() or not (directory / "adapter_config.json").is_file():
        return "refused: not an adapter directory"
    shutil.rmtree(directory)
    return "deleted"


async def apply_retention(
    engine: AsyncEngine, policy: str, *, keep_last: int, grace_s: float, now: datetime | None = None
) -> list[Deletion]:
    """Delete the files of the versions `plan_retention` picks, once their grace period is over."""
    now = now or datetime.now(timezone.utc)
    async with engine.connect() as connection:
        versions = [
            AdapterVersion.from_row(row)
            for row in await connection.execute(select(adapter_versions).where(adapter_versions.c.policy == policy))
        ]
        promoted = {
            row[0]
            for row in await connection.execute(
                select(adapter_transitions.c.adapter_version_id).where(
                    adapter_transitions.c.policy == policy,
                    adapter_transitions.c.to_status == VersionStatus.PROMOTED.value,
                )
            )
        }
        promoted |= {v.id for v in versions if v.status in EVER_PROMOTED_STATUSES}
        last = await lifecycle.last_status_changes(connection, policy)
    done = []
    for version in plan_retention(versions, keep_last, promoted):
        changed_at = last.get(version.id)
        if changed_at is not None and now - changed_at < timedelta(seconds=grace_s):
            continue
        result = delete_adapter_files(version.path)
        if result.startswith("refused"):
            log.warning("retention: not deleting %s for %s (%s)", version.path, version.name, result)
        else:
            async with engine.begin() as connection:
                await connection.execute(
                    update(adapter_versions)
                    .where(adapter_versions.c.id == version.id)
                    .values(files_deleted_at=func.now(), updated_at=func.now())
                )
        done.append(Deletion(version.id, version.name, version.path, result))
    return done
