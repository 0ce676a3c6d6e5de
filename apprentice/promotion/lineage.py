"""The training lineage of a policy: which version the next learner run continues.

The contract between the learner and the promotion job (both read it from the database):

- The lineage = the versions with status candidate or canary whose number is greater than
  the promoted version's (any such version while nothing is promoted). The head = the newest
  of them; with none, the promoted version; with nothing promoted, the base model (None).
- The learner trains each new version from the head (parent_version_id = head), so
  consecutive runs compose like the steps of one training instead of forking siblings.
- The promotion job serves the newest gated lineage version as the canary; the previous
  canary goes back to candidate ("superseded"). A significant gain promotes the canary, after
  which older lineage versions are older than the promoted one and so leave the lineage. A
  significant loss, or a rollback, rejects every lineage version: the head falls back to the
  promoted version and the learner starts again from it.
- Staleness: a run trains only on trajectories sampled by the head or by its ancestors at
  most `max_staleness` versions back (the base model is the root); see `ancestors`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus

LINEAGE_STATUSES = frozenset({VersionStatus.CANDIDATE, VersionStatus.CANARY})


def promoted_version(versions: Sequence[AdapterVersion]) -> AdapterVersion | None:
    return next((v for v in versions if v.status == VersionStatus.PROMOTED), None)


def lineage_versions(versions: Sequence[AdapterVersion]) -> list[AdapterVersion]:
    """The live lineage, oldest first: candidate/canary versions newer than the promoted one."""
    promoted = promoted_version(versions)
    floor = promoted.version if promoted is not None else 0
    return sorted((v for v in versions if v.status in LINEAGE_STATUSES and v.version > floor), key=lambda v: v.version)


def lineage_head(versions: Sequence[AdapterVersion]) -> AdapterVersion | None:
    """The version the next run continues: the newest lineage version, else the promoted
    version; None means the base model."""
    lineage = lineage_versions(versions)
    return lineage[-1] if lineage else promoted_version(versions)


def ancestors(head: AdapterVersion | None, versions: Sequence[AdapterVersion], limit: int) -> list[uuid.UUID | None]:
    """The head and the versions it descends from, nearest first, at most `limit` + 1 entries;
    None stands for the base model, the root of every chain."""
    by_id = {v.id: v for v in versions}
    chain: list[uuid.UUID | None] = []
    current = head
    while len(chain) <= limit:
        if current is None:
            chain.append(None)
            break
        chain.append(current.id)
        parent = current.parent_version_id
        current = by_id.get(parent) if parent is not None else None
        if parent is not None and current is None:  # a parent we no longer know: stop the chain there
            break
    return chain
