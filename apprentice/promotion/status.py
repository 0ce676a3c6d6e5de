"""The statuses of an adapter version and which transitions between them are allowed.

    candidate -> canary -> promoted -> retired -> promoted (rollback)
        |   ^      |
        |   +------+  canary -> candidate: superseded by a newer version of its lineage
        |          |
        +----------+--> rejected            candidate -> promoted ("promote now")

One enum for every side: the lifecycle writes these values, the gateway routes to the
SERVING ones, the admin API validates and documents them. It imports nothing, so the
gateway's request path can use it without pulling in the promotion machinery.
"""

from __future__ import annotations

from enum import Enum


class VersionStatus(str, Enum):
    """The `adapter_versions.status` column. A `str`, so rows and JSON compare equal to it."""

    CANDIDATE = "candidate"
    CANARY = "canary"
    PROMOTED = "promoted"
    RETIRED = "retired"
    REJECTED = "rejected"

    def __str__(self) -> str:  # "canary", not "VersionStatus.CANARY", in messages and f-strings
        return self.value

    @property
    def serving(self) -> bool:
        """Inference endpoints must hold this version's adapter and gateways route to it."""
        return self in SERVING

    def may_become(self, to_status: VersionStatus) -> bool:
        return self in ALLOWED[to_status]


# The versions gateways route calls to: every policy has at most one of each.
SERVING: frozenset[VersionStatus] = frozenset({VersionStatus.CANARY, VersionStatus.PROMOTED})

# to_status <- the statuses it may be entered from. "retired" is only ever entered as the side
# effect of another version's promotion; "rejected" is final; "candidate" is the first status,
# and a canary goes back to it only when the canary moves on to a newer version of its lineage
# (`lifecycle.supersede_canary`, which makes that newer version the canary in the same transaction).
ALLOWED: dict[VersionStatus, frozenset[VersionStatus]] = {
    VersionStatus.CANARY: frozenset({VersionStatus.CANDIDATE}),
    VersionStatus.PROMOTED: frozenset({VersionStatus.CANDIDATE, VersionStatus.CANARY, VersionStatus.RETIRED}),
    VersionStatus.RETIRED: frozenset({VersionStatus.PROMOTED}),
    VersionStatus.REJECTED: frozenset({VersionStatus.CANDIDATE, VersionStatus.CANARY}),
    VersionStatus.CANDIDATE: frozenset({VersionStatus.CANARY}),
}
