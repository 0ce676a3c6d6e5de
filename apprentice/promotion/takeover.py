"""Takeover: may a policy's lineage replace its teacher? Reward, cost and latency, compared.

A policy that names a teacher (apprentice.settings.TeacherSettings) is served by the teacher
until one of its versions is promoted; its canary is then compared with the teacher arm. The
arms are the ones every canary uses (apprentice.promotion.evaluation): the lineage's
trajectories, and the incumbent's, which for a policy with no promoted version are the
trajectories no adapter served (adapter_version_id NULL): the teacher's. The statistics are
the same (the policy's `promotion.method`, confidence and min_samples); only the question
differs. A canary against a promoted version must be significantly *better* to replace it; a
policy against its teacher is a non-inferiority question, since the reason to take over is
that the policy is as good for less:

    non-inferior:  the interval's low end > -takeover_margin  (not worse by more than the margin)
    inferior:      the interval's high end < -takeover_margin (worse by more than the margin)
    otherwise inconclusive (or insufficient, before min_samples in each arm).

The decision (`decide_takeover`): the lineage, or the newest version alone, inferior -> reject
(the policy stays behind the teacher; the learner keeps distilling); the lineage non-inferior,
the newest version not inferior, and the cost and latency conditions met -> promote (takeover);
else wait, and reject at the promotion timeout.

Cost per call: each arm's mean prompt and completion tokens of its answered calls since the
lineage's canary started, priced per token. Prices come from the model_info of the
teacher's model_list entry (`input_cost_per_token`, `output_cost_per_token`, LiteLLM's names),
else LiteLLM's bundled cost map (read as a file: the core never imports litellm), and from the
policy's own `model_info` (a self-hosted model has no list price: the operator states one).
When both are known, the policy must cost at most `max_cost_ratio` x the teacher per call;
when one is unknown, cost does not decide and the document says so. Latency: the median
`latency_ms` per call of each arm; with `max_latency_ratio` set, the policy's median must be at
most that multiple of the teacher's.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from apprentice.prices import litellm_cost_map, price_of
from apprentice.promotion.evaluation import INSUFFICIENT, PROMOTE, REJECT, REVIEW, TIMEOUT, WAIT, Comparison
from apprentice.settings import PolicySettings, Settings, TeacherSettings

NON_INFERIOR, INFERIOR, INCONCLUSIVE = "non_inferior", "inferior", "inconclusive"


@dataclass(frozen=True)
class Prices:
    """Per-token prices in the currency of the price list (LiteLLM's: US dollars)."""

    input: float
    output: float
    source: str

    def per_call(self, prompt_tokens: float, completion_tokens: float) -> float:
        return prompt_tokens * self.input + completion_tokens * self.output


def teacher_prices(settings: Settings, teacher: TeacherSettings) -> Prices | None:
    """The teacher's prices: those of its first deployment that has one, by the same lookup as the
    gateway's spend budgets (apprentice.prices.price_of: model_info, else LiteLLM's cost map)."""
    cost_map = litellm_cost_map()
    for entry in settings.model_list:
        if entry.model_name != teacher.model:
            continue
        params = entry.litellm_params
        found = price_of(entry.model_info, (params.model, params.upstream_model), cost_map)
        if found is not None:
            (per_input, per_output), source = found
            where = f"model_info of {teacher.model}" if source == "model_info" else source
            return Prices(per_input, per_output, where)
    return None


def policy_prices(policy: PolicySettings) -> Prices | None:
    """The policy's own prices: its model_info (its endpoints are not in any cost map)."""
    found = price_of(policy.model_info, (), {})
    return None if found is None else Prices(found[0][0], found[0][1], f"model_info of {policy.name}")


@dataclass(frozen=True)
class ArmCalls:
    """One arm's answered calls since the canary started: how many, tokens and latency."""

    calls: int = 0
    mean_prompt_tokens: float | None = None
    mean_completion_tokens: float | None = None
    mean_latency_ms: float | None = None
    median_latency_ms: float | None = None

    def cost_per_call(self, prices: Prices | None) -> float | None:
        if prices is None or not self.calls:
            return None
        return prices.per_call(self.mean_prompt_tokens or 0.0, self.mean_completion_tokens or 0.0)

    def as_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "mean_completion_tokens": self.mean_completion_tokens,
            "mean_latency_ms": self.mean_latency_ms,
            "median_latency_ms": self.median_latency_ms,
        }


# Answered calls of the policy since the canary started, by arm: the lineage's versions, or the
# teacher's deployment with no adapter (the teacher arm). ix_calls_policy_created serves it.
_ARM_CALLS = text(
    """
SELECT CASE WHEN c.adapter_version_id = ANY(CAST(:lineage AS uuid[])) THEN 'policy' ELSE 'teacher' END AS arm,
       count(*) AS calls, avg(c.prompt_tokens) AS prompt, avg(c.completion_tokens) AS completion,
       avg(c.latency_ms) AS mean_latency,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY c.latency_ms) AS median_latency
FROM calls c
WHERE c.policy = :policy AND c.created_at >= :since AND c.status_code = 200
  AND (c.adapter_version_id = ANY(CAST(:lineage AS uuid[]))
       OR (c.adapter_version_id IS NULL AND c.upstream = :teacher))
GROUP BY 1
"""
)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


async def arm_calls(
    connection: AsyncConnection, policy: str, teacher: str, lineage_ids: Sequence[uuid.UUID], since: datetime
) -> tuple[ArmCalls, ArmCalls]:
    """(the lineage's, the teacher's) answered calls since `since`."""
    found = {"policy": ArmCalls(), "teacher": ArmCalls()}
    rows = await connection.execute(
        _ARM_CALLS, {"policy": policy, "since": since, "lineage": [str(i) for i in lineage_ids], "teacher": teacher}
    )
    for row in rows:
        found[row.arm] = ArmCalls(
            int(row.calls),
            _float(row.prompt),
            _float(row.completion),
            _float(row.mean_latency),
            _float(row.median_latency),
        )
    return found["policy"], found["teacher"]


def non_inferiority(comparison: Comparison, margin: float) -> str:
    """non_inferior | inferior | inconclusive | insufficient, from the comparison's interval."""
    if comparison.interval is None:
        return INSUFFICIENT
    if comparison.interval.low > -margin:
        return NON_INFERIOR
    if comparison.interval.high < -margin:
        return INFERIOR
    return INCONCLUSIVE


@dataclass(frozen=True)
class Takeover:
    """The teacher comparison: reward verdicts, cost and latency, and the decision."""

    decision: str
    reason: str
    document: dict[str, Any]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def decide_takeover(
    lineage: Comparison,
    newest: Comparison,
    policy_calls: ArmCalls,
    teacher_calls: ArmCalls,
    *,
    teacher: TeacherSettings,
    teacher_price: Prices | None,
    policy_price: Prices | None,
    mode: str,
    elapsed_s: float,
    timeout_s: float,
) -> Takeover:
    """Promote (take over), reject (stay behind), wait, time out or leave to review; see the module docstring."""
    margin = teacher.takeover_margin
    lineage_verdict = non_inferiority(lineage, margin)
    newest_verdict = non_inferiority(newest, margin)
    policy_cost = policy_calls.cost_per_call(policy_price)
    teacher_cost = teacher_calls.cost_per_call(teacher_price)
    cost_ratio = _ratio(policy_cost, teacher_cost)
    latency_ratio = _ratio(policy_calls.median_latency_ms, teacher_calls.median_latency_ms)
    cost_ok = teacher.max_cost_ratio is None or cost_ratio is None or cost_ratio <= teacher.max_cost_ratio
    latency_ok = (
        teacher.max_latency_ratio is None or latency_ratio is None or latency_ratio <= teacher.max_latency_ratio
    )
    saving = None if teacher_cost is None else teacher_cost - (policy_cost or 0.0)
    interval = lineage.interval
    reward_words = (
        f"reward difference {interval.difference:+.4f}, interval [{interval.low:+.4f}, {interval.high:+.4f}], "
        f"margin {margin:g}"
        if interval is not None
        else f"n={lineage.canary.n} vs teacher {lineage.incumbent.n}"
    )
    saves = (
        f"; saves {saving:.6g} per call ({teacher_cost:.6g} -> {policy_cost:.6g})"
        if saving is not None and policy_cost is not None
        else (f"; teacher costs {teacher_cost:.6g} per call, the policy's price is unknown" if teacher_cost else "")
    )
    if mode != "automatic":
        decision, reason = REVIEW, f"awaiting review: {lineage_verdict} ({reward_words}){saves}"
    elif lineage_verdict == INFERIOR or newest_verdict == INFERIOR:
        which = "lineage" if lineage_verdict == INFERIOR else "newest version"
        decision, reason = (
            REJECT,
            f"stays behind the teacher: the {which} is worse by more than the margin ({reward_words})",
        )
    elif lineage_verdict == NON_INFERIOR and cost_ok and latency_ok:
        decision, reason = PROMOTE, f"takes over from the teacher: not worse within the margin ({reward_words}){saves}"
    elif elapsed_s >= timeout_s:
        decision, reason = TIMEOUT, f"no takeover within {timeout_s:g}s ({reward_words})"
    else:
        decision = WAIT
        held = [] if cost_ok else [f"costs {cost_ratio:.3g}x the teacher (max {teacher.max_cost_ratio:g})"]
        if not latency_ok:
            held.append(f"median latency {latency_ratio:.3g}x the teacher's (max {teacher.max_latency_ratio:g})")
        reason = f"behind the teacher: {lineage_verdict} ({reward_words})" + (f"; {'; '.join(held)}" if held else "")
    document = {
        "teacher": teacher.model,
        "margin": margin,
        "verdict": lineage_verdict,
        "newest_verdict": newest_verdict,
        "decision": decision,
        "reason": reason,
        "cost": {
            "policy_per_call": policy_cost,
            "teacher_per_call": teacher_cost,
            "saving_per_call": saving,
            "ratio": cost_ratio,
            "max_ratio": teacher.max_cost_ratio,
            "ok": cost_ok,
            "policy_prices": None if policy_price is None else policy_price.__dict__,
            "teacher_prices": None if teacher_price is None else teacher_price.__dict__,
        },
        "latency": {
            "policy_median_ms": policy_calls.median_latency_ms,
            "teacher_median_ms": teacher_calls.median_latency_ms,
            "ratio": latency_ratio,
            "max_ratio": teacher.max_latency_ratio,
            "ok": latency_ok,
        },
        "calls": {"policy": policy_calls.as_json(), "teacher": teacher_calls.as_json()},
    }
    return Takeover(decision, reason, _json_safe(document))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
