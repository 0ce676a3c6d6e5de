"""The evaluation gate: the version about to become the canary, against the promoted one.

Called by `promotion.serving` right before a version would start serving as the canary (a
first canary, or the lineage's newer version taking the canary's place), never for every
candidate: scoring means calls at the endpoints that serve traffic. With
`promotion.eval_gate: {set, margin, alpha, power}` the version is scored on the set
(`runner`), the promoted version (or the base model) too (its latest run is reused when it
scored every current item), and the per-item differences are tested (`paired`). The version
serves only when it is shown not worse than the promoted one by more than the margin.

EvalGateRefused: the figures say no (the automatic job rejects the version with this reason, an
admin's approval answers 409 with it). EvalGateUnavailable: the set could not be scored (no set,
no items, an endpoint or a scorer failing): nothing serves, and the next tick tries again.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.evalsets import store
from apprentice.evalsets.paired import PairedTest, non_inferiority
from apprentice.evalsets.runner import EvalUnavailable, ScoredRun, score_on_set, target_of
from apprentice.promotion import lifecycle
from apprentice.promotion.lifecycle import TransitionError
from apprentice.promotion.rows import AdapterVersion
from apprentice.settings import EvalGateSettings, PolicySettings, Settings

__all__ = ["EvalGateRefused", "EvalGateUnavailable", "require_eval_gate"]


class EvalGateRefused(TransitionError):
    """The version is worse on the evaluation set than the gate allows; it never serves."""


class EvalGateUnavailable(TransitionError):
    """The evaluation gate could not decide (set missing or empty, scoring failed): not now."""


async def _incumbent_scores(
    engine: AsyncEngine,
    settings: Settings,
    policy: PolicySettings,
    eval_set: store.EvalSet,
    incumbent: AdapterVersion | None,
    items: list[uuid.UUID],
    client: httpx.AsyncClient | None,
) -> ScoredRun:
    """The promoted version's (or base model's) scores on every current item: its latest run
    when that scored all of them, else a new run."""
    for run in await store.latest_runs(engine, eval_set.id, target_of(policy, incumbent)):
        results = await store.results_of(engine, run.id)
        if all(item in results and results[item].score is not None for item in items):
            return ScoredRun(run, results)
    return await score_on_set(engine, settings, policy, eval_set, incumbent, trigger="gate", client=client)


def _unscored(scored: ScoredRun, items: list[uuid.UUID]) -> list[str]:
    return [
        f"{item}: {scored.results[item].detail if item in scored.results else 'missing'}"
        for item in items
        if item not in scored.results or scored.results[item].score is None
    ]


async def require_eval_gate(
    engine: AsyncEngine,
    settings: Settings,
    policy: PolicySettings,
    version: AdapterVersion,
    *,
    client: httpx.AsyncClient | None = None,
) -> PairedTest | None:
    """Raise unless `version` may serve by the policy's evaluation gate; None when there is no gate.

    The comparison is stored in the version's `gates` document under `eval_gate`."""
    gate = policy.promotion.eval_gate
    if gate is None:
        return None
    try:
        eval_set = await store.get_set(engine, policy.name, gate.set)
    except store.SetNotFound as exc:
        raise EvalGateUnavailable(f"evaluation gate: {exc}", current=version.status) from None
    async with engine.connect() as connection:
        incumbent = (await lifecycle.serving_versions(connection, policy.name)).promoted
    try:
        mine = await score_on_set(engine, settings, policy, eval_set, version, trigger="gate", client=client)
        items = list(mine.results)
        theirs = await _incumbent_scores(engine, settings, policy, eval_set, incumbent, items, client)
    except EvalUnavailable as exc:
        raise EvalGateUnavailable(f"evaluation gate on set {gate.set!r}: {exc}", current=version.status) from None
    unscored = _unscored(mine, items) + _unscored(theirs, items)
    if unscored:
        shown = "; ".join(unscored[:3]) + (f" (and {len(unscored) - 3} more)" if len(unscored) > 3 else "")
        raise EvalGateUnavailable(
            f"evaluation gate on set {gate.set!r}: {len(unscored)} answers not scored: {shown}", current=version.status
        )
    try:
        test = non_inferiority(
            [mine.results[i].score or 0.0 for i in items],
            [theirs.results[i].score or 0.0 for i in items],
            margin=gate.margin,
            alpha=gate.alpha,
            power=gate.power,
        )
    except ValueError as exc:
        raise EvalGateUnavailable(f"evaluation gate on set {gate.set!r}: {exc}", current=version.status) from None
    document = _document(gate, test, mine, theirs, incumbent)
    current = await lifecycle.find_version(engine, version.id)
    await lifecycle.update_jsonb(engine, version.id, "gates", {**current.gates, "eval_gate": document})
    if not test.passed:
        raise EvalGateRefused(_refusal(gate, test, version, incumbent), current=version.status)
    return test


def _document(
    gate: EvalGateSettings, test: PairedTest, mine: ScoredRun, theirs: ScoredRun, incumbent: AdapterVersion | None
) -> dict[str, Any]:
    return {
        **test.as_json(),
        "set": gate.set,
        "outcome": "pass" if test.passed else "fail",
        "run_id": str(mine.run.id),
        "incumbent_run_id": str(theirs.run.id),
        "incumbent": incumbent.name if incumbent is not None else "base",
    }


def _refusal(
    gate: EvalGateSettings, test: PairedTest, version: AdapterVersion, incumbent: AdapterVersion | None
) -> str:
    against = incumbent.name if incumbent is not None else "the base model"
    reason = (
        f"evaluation gate failed on set {gate.set!r}: {version.name} is not shown within {gate.margin:g} "
        f"of {against} ({test.summary()})"
    )
    # Within the margin on average but not shown to be: the set, not the version, is the problem.
    if test.underpowered and test.items_for_power is not None and test.mean_difference > -test.margin:
        reason += f"; the set is too small for power {gate.power:g}: about {test.items_for_power} items needed"
    return reason
