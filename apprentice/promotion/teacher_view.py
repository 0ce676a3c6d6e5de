"""What the admin API and the dashboard show of a policy's teacher (docs/distillation.md).

One read: the teacher's settings and prices, where the policy stands (the teacher serves it,
its canary is compared with the teacher, or it took over), its distilled versions (versions
made by training runs of kind "sft", with what each trained on), and the latest comparison with
the teacher: reward statistics, cost and latency per call. For a live canary the comparison is
computed now (canary.evaluate_canary, as the version page does); otherwise it is the one
stored with the version that was last compared with the teacher.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion import lifecycle, takeover
from apprentice.promotion.canary import evaluate_canary
from apprentice.promotion.lineage import promoted_version
from apprentice.promotion.policies import policy_settings
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus
from apprentice.settings import Settings
from apprentice.store.tables import training_runs

TEACHER_SERVES, CANARY, TAKEN_OVER = "teacher_serves", "canary", "taken_over"


class NoTeacher(LookupError):
    def __init__(self, policy: str) -> None:
        super().__init__(f"policy {policy!r} names no teacher (policies[].teacher in the config file)")


async def teacher_status(engine: AsyncEngine, settings: Settings, policy_name: str) -> dict[str, Any]:
    """The policy's teacher, its distilled versions and the comparison (JSON-ready)."""
    policy = policy_settings(settings, policy_name)
    teacher = policy.teacher
    if teacher is None:
        raise NoTeacher(policy_name)
    async with engine.connect() as connection:
        versions = await lifecycle.versions_of(connection, policy.name, tuple(VersionStatus))
        runs = {
            row.id: row
            for row in await connection.execute(
                select(
                    training_runs.c.id,
                    training_runs.c.trajectories,
                    training_runs.c.tokens,
                    training_runs.c.loss,
                    training_runs.c.metrics,
                    training_runs.c.finished_at,
                ).where(training_runs.c.policy == policy.name, training_runs.c.kind == "sft")
            )
        }
    distilled = [
        {
            "id": str(v.id),
            "name": v.name,
            "version": v.version,
            "status": v.status.value,
            "parent_version_id": str(v.parent_version_id) if v.parent_version_id else None,
            "training_run_id": str(v.training_run_id),
            "trajectories": runs[v.training_run_id].trajectories,
            "tokens": runs[v.training_run_id].tokens,
            "loss": runs[v.training_run_id].loss,
            "selection": (runs[v.training_run_id].metrics or {}).get("distill"),
            "created_at": v.created_at.isoformat() if v.created_at else None,
        }
        for v in versions
        if v.training_run_id in runs
    ]
    canary = next((v for v in versions if v.status == VersionStatus.CANARY), None)
    promoted = promoted_version(versions)
    status = TAKEN_OVER if promoted is not None else CANARY if canary is not None else TEACHER_SERVES
    if canary is not None and promoted is None:
        live = await evaluate_canary(engine, settings, canary)
        canary = dataclasses.replace(canary, evaluation=live.document)
    compared = _last_compared(versions, canary)
    prices = takeover.teacher_prices(settings, teacher)
    own = takeover.policy_prices(policy)
    return {
        "object": "policy.teacher",
        "policy": policy.name,
        "teacher": {
            **teacher.model_dump(mode="json"),
            "prices": None if prices is None else dataclasses.asdict(prices),
            "policy_prices": None if own is None else dataclasses.asdict(own),
        },
        "status": status,
        "promoted": promoted.name if promoted else None,
        "canary": canary.name if canary else None,
        "distilled_versions": distilled,
        "compared_version": compared.name if compared else None,
        "comparison": _comparison(compared.evaluation) if compared else None,
    }


def _last_compared(versions: list[AdapterVersion], canary: AdapterVersion | None) -> AdapterVersion | None:
    """The newest version compared with the teacher (the canary with its live evaluation)."""
    for version in sorted(versions, key=lambda v: v.version, reverse=True):
        if canary is not None and version.id == canary.id:
            version = canary
        if isinstance(version.evaluation, dict) and "takeover" in version.evaluation:
            return version
    return None


def _comparison(evaluation: dict[str, Any]) -> dict[str, Any]:
    """The takeover document with the reward statistics of both arms beside it."""
    return {
        **evaluation["takeover"],
        "reward": {
            "policy": evaluation.get("canary"),
            "teacher": evaluation.get("incumbent"),
            "interval": evaluation.get("interval"),
            "method": evaluation.get("method"),
            "confidence": evaluation.get("confidence"),
        },
        "evaluated_at": evaluation.get("evaluated_at"),
    }
