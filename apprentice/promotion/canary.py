"""The canary's evaluation: its lineage's rewards, and its own, against the promoted version's.

The tick stores the result in `adapter_versions.evaluation` and acts on its decision; the
version page computes it live for a canary. The statistics are in `evaluation`, the question
"has the policy overtaken its teacher" in `takeover`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion import evaluation as ev
from apprentice.promotion import lifecycle, takeover
from apprentice.promotion.clock import process_now
from apprentice.promotion.gates import json_number
from apprentice.promotion.lineage import lineage_versions, promoted_version
from apprentice.promotion.policies import policy_settings
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus
from apprentice.settings import Settings

__all__ = ["CanaryEvaluation", "evaluate_canary"]

CANDIDATE, CANARY, PROMOTED = VersionStatus.CANDIDATE, VersionStatus.CANARY, VersionStatus.PROMOTED


@dataclass(frozen=True)
class CanaryEvaluation:
    """The lineage's comparison with the promoted version, and what an automatic policy does now."""

    decision: str  # evaluation.PROMOTE | REJECT | TIMEOUT | WAIT | REVIEW
    document: dict[str, Any]  # stored in adapter_versions.evaluation (JSON-safe numbers)

    @property
    def summary(self) -> str:
        """The interval in words, for transition reasons and the job's report."""
        document = self.document
        interval = document.get("interval") or {}
        if not interval:
            return f"n={document['canary']['n']}/{document['incumbent']['n']}"
        return (
            f"mean difference {interval['difference']:+.4f}, {document['confidence']:.0%} interval "
            f"[{interval['low']:+.4f}, {interval['high']:+.4f}] ({document['method']}, "
            f"n={document['canary']['n']} vs {document['incumbent']['n']})"
        )


async def evaluate_canary(
    engine: AsyncEngine, settings: Settings, version: AdapterVersion, now: datetime | None = None
) -> CanaryEvaluation:
    """Compare the canary's lineage, and the canary alone, with the promoted version.

    The lineage's arm runs from its first canary start (`lifecycle.lineage_started_at`), not
    from the latest move of the canary, so the evidence gathered by the versions the canary
    superseded keeps counting; the canary's own arm runs from when it became the canary. The
    top-level `canary`, `incumbent` and `interval` of the document are the lineage's
    comparison; `newest` holds the canary's own.
    """
    policy = policy_settings(settings, version.policy)
    promotion = policy.promotion
    reward_name = policy.learning.reward_name
    now = now or process_now()
    async with engine.connect() as connection:
        newest_since = await lifecycle.last_transition_at(connection, version.id, CANARY) or version.updated_at
        since = min(await lifecycle.lineage_started_at(connection, version.policy) or newest_since, newest_since)
        versions = await lifecycle.versions_of(connection, version.policy, (CANDIDATE, CANARY, PROMOTED))
        incumbent = promoted_version(versions)
        lineage = lineage_versions(versions)
        found = await ev.canary_units(
            connection,
            version.policy,
            [v.id for v in lineage],
            version.id,
            newest_since,
            incumbent.id if incumbent else None,
            since,
            now - timedelta(seconds=promotion.settle_s),
            reward_name,
        )
    options: dict[str, Any] = {
        "method": promotion.method,
        "min_samples": promotion.min_samples,
        "reward_range": policy.reward_range,
    }
    # The false-verdict budget 1 - confidence is shared: most for the lineage's interval and test,
    # the rest spent over the lineage's successive newest versions (the k-th gets 6 / (pi k)^2 of
    # it); the tests spend it only on the verdicts decide_lineage acts on (ev.decision_alphas).
    position = next((i for i, v in enumerate(lineage, 1) if v.id == version.id), len(lineage) + 1)
    lineage_alpha, newest_alpha = ev.alpha_split(1.0 - promotion.confidence, newest_index=position)
    lineage_test, newest_test = ev.decision_alphas(1.0 - promotion.confidence, newest_index=position)
    # Off the event loop: a bootstrap over large arms takes seconds of pure Python, and the
    # admin API calls this when a version is opened.
    comparison = await asyncio.to_thread(
        ev.compare, found.lineage, confidence=1.0 - lineage_alpha, direction_alphas=lineage_test, **options
    )
    newest = await asyncio.to_thread(
        ev.compare, found.newest, confidence=1.0 - newest_alpha, direction_alphas=newest_test, **options
    )
    elapsed = (now - since).total_seconds()
    decision = ev.decide_lineage(
        comparison, newest, mode=promotion.mode, elapsed_s=elapsed, timeout_s=promotion.timeout_s
    )
    extra: dict[str, Any] = {}
    if policy.teacher is not None and incumbent is None:
        # Behind its teacher: the incumbent arm is the teacher's; the question is takeover (takeover.py).
        async with engine.connect() as connection:
            policy_calls, teacher_calls = await takeover.arm_calls(
                connection, version.policy, policy.teacher.model, [v.id for v in lineage] + [version.id], since
            )
        verdict = takeover.decide_takeover(
            comparison,
            newest,
            policy_calls,
            teacher_calls,
            teacher=policy.teacher,
            teacher_price=takeover.teacher_prices(settings, policy.teacher),
            policy_price=takeover.policy_prices(policy),
            mode=promotion.mode,
            elapsed_s=elapsed,
            timeout_s=promotion.timeout_s,
        )
        decision = verdict.decision
        extra["takeover"] = verdict.document
    document = {
        **comparison.as_json(),
        "verdict": comparison.verdict,
        "decision": decision,
        "mode": promotion.mode,
        "canary_since": since.isoformat(),
        "newest_since": newest_since.isoformat(),
        "newest": {**newest.as_json(), "verdict": newest.verdict, "version": version.name},
        "lineage": [v.name for v in lineage if v.id != version.id] + [version.name],
        "elapsed_s": round(elapsed, 3),
        "timeout_s": promotion.timeout_s,
        "timed_out": elapsed >= promotion.timeout_s,
        "incumbent_version_id": str(incumbent.id) if incumbent else None,
        "incumbent_name": incumbent.name if incumbent else None,
        "reward_name": reward_name,
        "evaluated_at": now.isoformat(),
        **extra,
    }
    return CanaryEvaluation(decision, {k: (json_number(v) if isinstance(v, float) else v) for k, v in document.items()})
