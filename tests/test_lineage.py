"""The lineage rules as pure functions over version rows: which versions are live, which one the
next learner run continues, and how far back a run may take its trajectories from."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from apprentice.promotion.lineage import ancestors, lineage_head, lineage_versions, promoted_version
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def version(number: int, status: VersionStatus, parent: AdapterVersion | None = None) -> AdapterVersion:
    return AdapterVersion(
        id=uuid.uuid4(),
        policy="p",
        version=number,
        name=f"p-v{number}",
        status=status,
        base_model="base",
        path=f"/adapters/p-v{number}",
        parent_version_id=parent.id if parent else None,
        training_run_id=None,
        rank=8,
        alpha=16.0,
        target_modules=None,
        canary_share=None,
        gates={},
        evaluation={},
        files_deleted_at=None,
        created_at=NOW,
        updated_at=NOW,
    )


def test_no_versions_means_the_base_model_heads_an_empty_lineage():
    assert lineage_versions([]) == []
    assert lineage_head([]) is None
    assert promoted_version([]) is None


def test_without_a_promoted_version_every_candidate_and_canary_is_in_the_lineage():
    v1 = version(1, VersionStatus.CANARY)
    v2 = version(2, VersionStatus.CANDIDATE, v1)
    v3 = version(3, VersionStatus.REJECTED, v2)
    assert lineage_versions([v3, v2, v1]) == [v1, v2]
    assert lineage_head([v3, v2, v1]) == v2


def test_the_lineage_starts_above_the_promoted_version_and_the_head_is_its_newest():
    v1 = version(1, VersionStatus.RETIRED)
    v2 = version(2, VersionStatus.CANDIDATE, v1)  # superseded before v3 was promoted: older, so out
    v3 = version(3, VersionStatus.PROMOTED, v2)
    v4 = version(4, VersionStatus.CANDIDATE, v3)
    v5 = version(5, VersionStatus.CANARY, v4)
    v6 = version(6, VersionStatus.CANDIDATE, v5)
    rows = [v6, v1, v4, v3, v5, v2]
    assert lineage_versions(rows) == [v4, v5, v6]
    assert lineage_head(rows) == v6


def test_a_rejected_lineage_falls_back_to_the_promoted_version():
    v1 = version(1, VersionStatus.PROMOTED)
    v2 = version(2, VersionStatus.REJECTED, v1)
    v3 = version(3, VersionStatus.REJECTED, v2)
    assert lineage_versions([v1, v2, v3]) == []
    assert lineage_head([v1, v2, v3]) == v1


def test_ancestors_walk_parents_nearest_first_to_the_base_model_within_the_limit():
    v1 = version(1, VersionStatus.PROMOTED)
    v2 = version(2, VersionStatus.CANDIDATE, v1)
    v3 = version(3, VersionStatus.CANARY, v2)
    rows = [v1, v2, v3]
    assert ancestors(v3, rows, limit=10) == [v3.id, v2.id, v1.id, None]
    assert ancestors(v3, rows, limit=1) == [v3.id, v2.id]
    assert ancestors(v3, rows, limit=0) == [v3.id]
    assert ancestors(None, rows, limit=3) == [None]


def test_ancestors_stop_at_a_parent_that_is_no_longer_known():
    gone = version(1, VersionStatus.RETIRED)
    v2 = version(2, VersionStatus.PROMOTED, gone)
    assert ancestors(v2, [v2], limit=5) == [v2.id]
