"""The read models of the admin API and the dashboard: policies, their versions, one version.

Reads only: nothing here changes a version (that is `actions`) or runs the job (`tick`).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion import lifecycle
from apprentice.promotion.canary import evaluate_canary
from apprentice.promotion.gate_checks import training_run_of
from apprentice.promotion.lineage import lineage_head, lineage_versions
from apprentice.promotion.policies import policy_settings
from apprentice.promotion.provenance import Provenance, provenance
from apprentice.promotion.rows import AdapterVersion, PolicyState, TrainingRun, Transition
from apprentice.promotion.status import SERVING, VersionStatus
from apprentice.settings import PolicySettings, Settings

__all__ = [
    "PolicySummary",
    "VersionDetail",
    "VersionListing",
    "list_policies",
    "list_versions",
    "version_detail",
    "version_listing",
]

CANDIDATE, CANARY, PROMOTED = VersionStatus.CANDIDATE, VersionStatus.CANARY, VersionStatus.PROMOTED


@dataclass(frozen=True)
class PolicySummary:
    """A configured policy with what serves it now and what waits."""

    policy: PolicySettings
    state: PolicyState | None  # None: never paused or resumed
    promoted: AdapterVersion | None
    canary: AdapterVersion | None
    candidates: int
    lineage: list[AdapterVersion]  # the live lineage, oldest first (`lineage.lineage_versions`)
    lineage_head: AdapterVersion | None  # what the next learner run continues; None: the base model

    @property
    def learning_paused(self) -> bool:
        return self.state is not None and self.state.learning_paused

    @property
    def paused_by(self) -> str | None:
        return self.state.updated_by if self.state is not None and self.state.learning_paused else None


@dataclass(frozen=True)
class VersionDetail:
    """A version (for a canary: with its evaluation computed now), its training run and transitions."""

    version: AdapterVersion
    training_run: TrainingRun | None
    transitions: list[Transition]
    provenance: Provenance
    lineage_head: AdapterVersion | None


@dataclass(frozen=True)
class VersionListing:
    """A policy's versions, newest first, each with its provenance, and the lineage's head."""

    versions: list[AdapterVersion]
    provenance: dict[uuid.UUID, Provenance]
    lineage_head: AdapterVersion | None


async def list_policies(engine: AsyncEngine, settings: Settings) -> list[PolicySummary]:
    async with engine.connect() as connection:
        states = await lifecycle.policy_states(connection)
        versions = await lifecycle.versions_of(connection, None, (CANDIDATE, *SERVING))
    summaries = []
    for policy in settings.policies:
        own = [version for version in versions if version.policy == policy.name]
        by_status = {version.status: version for version in own if version.status.serving}
        lineage = lineage_versions(own)
        summaries.append(
            PolicySummary(
                policy,
                states.get(policy.name),
                by_status.get(PROMOTED),
                by_status.get(CANARY),
                sum(1 for v in lineage if v.status == CANDIDATE),
                lineage,
                lineage_head(own),
            )
        )
    return summaries


async def list_versions(
    engine: AsyncEngine, settings: Settings, policy: str, status: VersionStatus | None = None
) -> list[AdapterVersion]:
    """A configured policy's versions (only those in `status`, when given), newest first."""
    policy_settings(settings, policy)
    async with engine.connect() as connection:
        versions = await lifecycle.versions_of(connection, policy, (status,) if status else tuple(VersionStatus))
    return versions[::-1]


async def version_listing(
    engine: AsyncEngine, settings: Settings, policy: str, status: VersionStatus | None = None
) -> VersionListing:
    """`list_versions` with each version's parent, lineage membership, samples and samplers."""
    policy_settings(settings, policy)
    async with engine.connect() as connection:
        every = await lifecycle.versions_of(connection, policy, tuple(VersionStatus))
        shown = [v for v in every if status is None or v.status == status][::-1]
        found = await provenance(connection, shown, every)
    return VersionListing(shown, found, lineage_head(every))


async def version_detail(engine: AsyncEngine, settings: Settings, ref: str | uuid.UUID) -> VersionDetail:
    """A version with its training run, gates, canary statistics (live for a canary) and transitions."""
    version = await lifecycle.find_version(engine, ref)
    async with engine.connect() as connection:
        transitions = await lifecycle.transitions_of(connection, version.id)
        every = await lifecycle.versions_of(connection, version.policy, tuple(VersionStatus))
        found = (await provenance(connection, [version], every))[version.id]
    run = await training_run_of(engine, version)
    if version.status == CANARY and settings.policy(version.policy) is not None:
        live = await evaluate_canary(engine, settings, version)
        version = dataclasses.replace(version, evaluation=live.document)
    return VersionDetail(version, run, transitions, found, lineage_head(every))
