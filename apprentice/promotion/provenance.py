"""Where a version came from, for the admin API: its parent, whether it is in the live lineage,
how many samples its training run took and of which kind (rl, sft), and which versions sampled
the trajectories it trained on.

With the learner training along the lineage, a version's data comes from several versions (the
canary, the ones it superseded, the promoted one); "sampled_by" shows how off-policy a run was.
Read in two grouped queries for any number of versions, so a listing costs what a detail does.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from apprentice.promotion.lineage import lineage_versions
from apprentice.promotion.rows import AdapterVersion
from apprentice.store.tables import training_runs, trajectories

BASE_MODEL = None  # the name `sampled_by` gives trajectories the base model served


@dataclass(frozen=True)
class Sampler:
    """A version (None: the base model) that sampled some of the trajectories a run trained on."""

    version_id: uuid.UUID | None
    name: str | None
    trajectories: int


@dataclass(frozen=True)
class Provenance:
    parent: AdapterVersion | None
    in_lineage: bool  # a candidate or the canary newer than the promoted version
    samples: int | None  # the training run's sample count (None: no run recorded)
    sampled_by: list[Sampler] = field(default_factory=list)
    kind: str | None = None  # the training run's kind, rl or sft (None: no run recorded)


async def provenance(
    connection: AsyncConnection, versions: Sequence[AdapterVersion], every_version: Sequence[AdapterVersion]
) -> dict[uuid.UUID, Provenance]:
    """`Provenance` of each of `versions`; `every_version`: all the policy's versions (for
    parents' names and the lineage)."""
    by_id = {v.id: v for v in every_version}
    live = {v.id for v in lineage_versions(every_version)}
    runs = [v.training_run_id for v in versions if v.training_run_id is not None]
    samples: dict[uuid.UUID, int | None] = {}
    kinds: dict[uuid.UUID, str] = {}
    counts: dict[uuid.UUID, list[Sampler]] = {}
    if runs:
        rows = await connection.execute(
            select(training_runs.c.id, training_runs.c.samples, training_runs.c.kind).where(
                training_runs.c.id.in_(runs)
            )
        )
        for row in rows:
            samples[row.id], kinds[row.id] = row.samples, row.kind
        grouped = await connection.execute(
            select(trajectories.c.trained_in_run_id, trajectories.c.adapter_version_id, func.count())
            .where(trajectories.c.trained_in_run_id.in_(runs))
            .group_by(trajectories.c.trained_in_run_id, trajectories.c.adapter_version_id)
        )
        for run_id, version_id, count in grouped:
            sampler = by_id.get(version_id) if version_id is not None else None
            counts.setdefault(run_id, []).append(
                Sampler(version_id, sampler.name if sampler is not None else BASE_MODEL, int(count))
            )
    found = {}
    for version in versions:
        run = version.training_run_id
        sampled_by = sorted(counts.get(run, []) if run else [], key=lambda s: (-s.trajectories, s.name or ""))
        parent = by_id.get(version.parent_version_id) if version.parent_version_id is not None else None
        found[version.id] = Provenance(
            parent,
            version.id in live,
            samples.get(run) if run else None,
            sampled_by,
            kinds.get(run) if run else None,
        )
    return found
