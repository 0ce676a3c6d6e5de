"""Deleting a trajectory on request: its calls, its rewards, and any use the learner has not made yet.

Invariants:
- One transaction: the trajectory (its root and every alias merged into it), its calls and
  its rewards (linked ones, and pending ones that name it) go together or not at all.
- Tenant-scoped like every read: a key deletes its own tenant's trajectories only (the admin
  key any).
- What cannot be undone is said: adapter versions already trained on the trajectory (and the
  versions trained from them since) are listed in the answer; their weights are not retrained.
- A trajectory already deleted, or never seen, is "not found": deleting twice is harmless.

What this does not reach: a call of the trajectory still in a gateway process's journal (not
yet shipped, about a second) lands after the delete and makes the trajectory again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.connection import driver_connection

_ROOT = """
SELECT coalesce(t.merged_into, t.id) AS root FROM trajectories t
WHERE t.id = ANY(%(ids)s::uuid[]) AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
ORDER BY array_position(%(ids)s::uuid[], t.id) LIMIT 1
"""

_MEMBERS = "SELECT id FROM trajectories WHERE id = %(root)s OR merged_into = %(root)s FOR UPDATE"

# The versions trained on these trajectories, and every version trained from them since.
_TRAINED_INTO = """
WITH RECURSIVE direct AS (
    SELECT DISTINCT r.produced_version_id AS id FROM trajectories t
    JOIN training_runs r ON r.id = t.trained_in_run_id
    WHERE t.id = ANY(%(ids)s::uuid[]) AND r.produced_version_id IS NOT NULL
), lineage AS (
    SELECT id, true AS direct FROM direct
    UNION
    SELECT v.id, false FROM adapter_versions v JOIN lineage l ON v.parent_version_id = l.id
)
SELECT v.name, v.status, v.policy, bool_or(l.direct) AS direct
FROM lineage l JOIN adapter_versions v ON v.id = l.id
GROUP BY v.name, v.status, v.policy, v.version ORDER BY v.version
"""


@dataclass(slots=True)
class Deleted:
    trajectory_id: uuid.UUID
    aliases: list[uuid.UUID] = field(default_factory=list)
    calls: int = 0
    rewards: int = 0
    trained_into: list[dict[str, Any]] = field(default_factory=list)


async def delete_trajectory(engine: AsyncEngine, candidates: list[uuid.UUID], tenant: str | None) -> Deleted | None:
    """Delete the first of `candidates` that names a trajectory of `tenant` (None: any)."""
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.transaction(), pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(_ROOT, {"ids": candidates, "tenant": tenant})
            found = await cursor.fetchone()
            if found is None:
                return None
            root = found["root"]
            await cursor.execute(_MEMBERS, {"root": root})
            ids = [row["id"] for row in await cursor.fetchall()]
            deleted = Deleted(root, [i for i in ids if i != root])
            await cursor.execute(_TRAINED_INTO, {"ids": ids})
            deleted.trained_into = list(await cursor.fetchall())
            await cursor.execute(
                "DELETE FROM rewards WHERE trajectory_id = ANY(%(ids)s::uuid[]) "
                "OR target_trajectory_id = ANY(%(ids)s::uuid[])",
                {"ids": ids},
            )
            deleted.rewards = cursor.rowcount
            await cursor.execute("DELETE FROM calls WHERE trajectory_id = ANY(%(ids)s::uuid[])", {"ids": ids})
            deleted.calls = cursor.rowcount
            await cursor.execute(
                "DELETE FROM trajectories WHERE id = ANY(%(ids)s::uuid[]) AND merged_into IS NOT NULL", {"ids": ids}
            )
            await cursor.execute("DELETE FROM trajectories WHERE id = %(root)s", {"root": root})
    return deleted
