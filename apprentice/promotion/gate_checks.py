"""The gates of a version's training run, read from the database and stored with the version.

`gates` holds the checks themselves (pure); this module finds the run, applies them, stores the
outcome in `adapter_versions.gates`, and refuses a transition a version's gates do not allow.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion import lifecycle
from apprentice.promotion.clock import process_now
from apprentice.promotion.files import adapter_files_problem
from apprentice.promotion.gates import GateReport, evaluate_gates, with_files_check
from apprentice.promotion.lifecycle import TransitionError
from apprentice.promotion.policies import policy_settings
from apprentice.promotion.rows import AdapterVersion, TrainingRun
from apprentice.settings import Settings
from apprentice.store.tables import training_runs

__all__ = ["check_gates", "require_gates", "training_run_of"]


async def training_run_of(engine: AsyncEngine, version: AdapterVersion) -> TrainingRun | None:
    query = select(training_runs)
    if version.training_run_id is not None:
        query = query.where(training_runs.c.id == version.training_run_id)
    else:  # the learner may only have filled training_runs.produced_version_id
        query = query.where(training_runs.c.produced_version_id == version.id)
    async with engine.connect() as connection:
        row = (await connection.execute(query.order_by(training_runs.c.started_at.desc()).limit(1))).first()
    return TrainingRun.from_row(row) if row is not None else None


async def check_gates(
    engine: AsyncEngine, settings: Settings, version: AdapterVersion, *, files: bool = False
) -> GateReport:
    """Evaluate the gates of a version's training run and store them in `adapter_versions.gates`.

    `files`: check the adapter's files too (`files.adapter_files_problem`); only the promotion
    job asks, since it runs where the adapters are written (a gateway may not see them)."""
    policy = policy_settings(settings, version.policy)
    report = evaluate_gates(await training_run_of(engine, version), policy.promotion.kl_bound)
    if files:
        report = with_files_check(report, await asyncio.to_thread(adapter_files_problem, version.path))
    document = {**report.as_json(), "kl_bound": policy.promotion.kl_bound, "checked_at": process_now().isoformat()}
    if version.gates.get("outcome") != report.outcome or report.outcome != "wait":
        await lifecycle.update_jsonb(engine, version.id, "gates", document)
    return report


async def require_gates(
    engine: AsyncEngine,
    settings: Settings,
    version: AdapterVersion,
    *,
    force: bool,
    hint: str = "",
    files: bool = False,
) -> GateReport:
    gates = await check_gates(engine, settings, version, files=files)
    if not gates.passed and not force:
        detail = "; ".join(gates.failures()) or "the training run has not finished"
        raise TransitionError(
            f"adapter version {version.name} does not pass the gates: {detail}{hint}", current=version.status
        )
    return gates
