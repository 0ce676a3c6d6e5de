"""Is the canary's lineage better than the promoted version? Rewards of the arms, compared.

The experiment: each run (or client group) is a unit assigned to the canary's arm with
probability equal to the canary share, independently of its prompt, and records its arm, the
share and its task (gateway/policies/versions.py, migration 0013). Two comparisons are made,
both by assigned arm (a unit counts in the arm it was drawn for, however its later calls were
served):
- the lineage: units assigned since the lineage's first canary started, the canary's arm being
  any version of the live lineage (the canary and the versions it superseded);
- the newest version: units assigned since it became the canary, its own arm against the
  incumbent's drawn in the same period; the version a promotion would make serve must not be
  significantly worse on its own.
A unit's value is the mean of its runs' *current* rewards of the configured name (status
'linked', not superseded); units without one are left out, and so are units assigned less than
`promotion.settle_s` ago (their rewards are still arriving).

The statistic: an interval on the canary's average effect, either the always-valid confidence
sequence of `sequential` (method "sequential", the default: compares each task with its own
history, valid at every look and every sample size) or a fixed-sample interval on the arms'
unit means, Welch's t (closed form, deterministic) or a percentile bootstrap (seeded); these
two are only valid for a single look and compare the arms' prompts along with their versions.
Significantly better: the whole interval is above 0; significantly worse: below 0; for the
sequential method, its test by betting decides instead (sharper at 0; the interval still gives
the effect's size), with the budget spent only on the verdicts the rule acts on (`decision_alphas`).
Nothing is decided before each arm has `min_samples` rewarded runs (the setting's unit: a
client's named group of 8 runs is one randomised unit and counts 8) and two units.

The statistics are pure functions (no database) and are unit-tested against known values.
"""

from __future__ import annotations

import dataclasses
import math
import random
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from apprentice.promotion.sequential import EffectInterval, Unit, confidence_sequence
from apprentice.store.tables import rewards, trajectories

BETTER, WORSE, INCONCLUSIVE, INSUFFICIENT = "better", "worse", "inconclusive", "insufficient"
PROMOTE, REJECT, WAIT, TIMEOUT, REVIEW = "promote", "reject", "wait", "timeout", "review"


# ---------------------------------------------------------------- Student's t distribution


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    if math.isinf(df):
        return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on the CDF)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


# ---------------------------------------------------------------- intervals


@dataclass(frozen=True)
class ArmStats:
    n: int
    mean: float | None
    std: float | None  # sample standard deviation (n - 1)

    @classmethod
    def of(cls, values: Sequence[float]) -> ArmStats:
        n = len(values)
        if n == 0:
            return cls(0, None, None)
        mean = math.fsum(values) / n
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
        return cls(n, mean, std)


@dataclass(frozen=True)
class Interval:
    difference: float  # mean(a) - mean(b)
    low: float
    high: float
    df: float | None = None  # Welch-Satterthwaite degrees of freedom
    # The sequential method's test by betting (sequential.py): its wealth against "no gain" and
    # against "no loss", and the wealth at which each direction decides (1 / its alpha; None: that
    # direction never decides). All None for the fixed-sample methods.
    wealth_better: float | None = None
    wealth_worse: float | None = None
    threshold_better: float | None = None
    threshold_worse: float | None = None

    @property
    def tested(self) -> bool:
        """Whether a test by betting decides (the sequential method), not the interval."""
        return self.threshold_better is not None or self.threshold_worse is not None


def verdict_of(interval: Interval) -> str:
    """Better, worse or inconclusive. The sequential method's test decides where it ran (a
    direction's wealth reached its threshold); a fixed-sample interval decides by whether it holds 0."""
    if interval.tested:
        if interval.threshold_better is not None and (interval.wealth_better or 0.0) >= interval.threshold_better:
            return BETTER
        if interval.threshold_worse is not None and (interval.wealth_worse or 0.0) >= interval.threshold_worse:
            return WORSE
        return INCONCLUSIVE
    return BETTER if interval.low > 0 else WORSE if interval.high < 0 else INCONCLUSIVE


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """Welch's t interval for mean(a) - mean(b); each sample needs at least 2 values."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's interval needs at least two values in each sample")
    sa, sb = ArmStats.of(a), ArmStats.of(b)
    assert sa.mean is not None and sb.mean is not None and sa.std is not None and sb.std is not None
    difference = sa.mean - sb.mean
    va, vb = sa.std**2 / sa.n, sb.std**2 / sb.n
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Interval(difference, difference, difference, math.inf)
    df = (va + vb) ** 2 / ((va**2 / (sa.n - 1) if va else 0.0) + (vb**2 / (sb.n - 1) if vb else 0.0))
    half = t_ppf(0.5 + confidence / 2.0, df) * se
    return Interval(difference, difference - half, difference + half, df)


def bootstrap_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Interval:
    """Percentile bootstrap interval for mean(a) - mean(b), resampling each arm independently."""
    if not a or not b:
        raise ValueError("the bootstrap needs values in both samples")
    rng = random.Random(seed)
    na, nb = len(a), len(b)
    differences = sorted(
        math.fsum(rng.choices(a, k=na)) / na - math.fsum(rng.choices(b, k=nb)) / nb for _ in range(resamples)
    )
    alpha = (1.0 - confidence) / 2.0
    low = differences[max(0, int(math.floor(alpha * resamples)))]
    high = differences[min(resamples - 1, int(math.ceil((1.0 - alpha) * resamples)) - 1)]
    return Interval(math.fsum(a) / na - math.fsum(b) / nb, low, high)


# ---------------------------------------------------------------- comparison and decision


@dataclass(frozen=True)
class Comparison:
    canary: ArmStats
    incumbent: ArmStats
    method: str
    confidence: float
    min_samples: int
    verdict: str  # better | worse | inconclusive | insufficient
    interval: Interval | None = None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.interval is not None and self.interval.df is not None and math.isinf(self.interval.df):
            data["interval"]["df"] = None
        return data


@dataclass(frozen=True)
class DirectionAlphas:
    """A test's false-verdict budget per direction: it says "better" wrongly with probability at
    most `better`, "worse" at most `worse` (Ville: a direction decides when its wealth reaches
    1 / its alpha). 0: that direction never decides."""

    better: float
    worse: float

    @classmethod
    def two_sided(cls, alpha: float) -> DirectionAlphas:
        return cls(alpha / 2.0, alpha / 2.0)


def sequential_interval(
    units: Sequence[Unit],
    confidence: float = 0.95,
    reward_range: tuple[float, float] | None = None,
    direction_alphas: DirectionAlphas | None = None,
) -> Interval:
    """The always-valid interval on the canary's average effect at alpha = 1 - confidence, with
    the test by betting at `direction_alphas` (two-sided at the same alpha when None).

    The reward range scales the test: the policy's declared range when set, else the smallest
    range holding every observed reward."""
    if reward_range is None:
        values = [unit.value for unit in units]
        reward_range = (min(values), max(values)) if values else (0.0, 1.0)
        if reward_range[0] == reward_range[1]:
            reward_range = (reward_range[0], reward_range[0] + 1.0)
    found = confidence_sequence(units, alpha=1.0 - confidence, reward_range=reward_range)
    return sequential_result(found, direction_alphas)


def sequential_result(found: EffectInterval, direction_alphas: DirectionAlphas | None = None) -> Interval:
    """The confidence sequence's interval with its test's wealth and thresholds (what `verdict_of`
    reads); the test is two-sided at the interval's alpha unless `direction_alphas` says otherwise."""
    alphas = direction_alphas or DirectionAlphas.two_sided(found.alpha)
    return Interval(
        found.difference,
        found.low,
        found.high,
        wealth_better=found.wealth_better,
        wealth_worse=found.wealth_worse,
        threshold_better=1.0 / alphas.better if alphas.better > 0 else None,
        threshold_worse=1.0 / alphas.worse if alphas.worse > 0 else None,
    )


def compare(
    units: Sequence[Unit],
    *,
    method: str = "welch",
    confidence: float = 0.95,
    min_samples: int = 30,
    seed: int = 0,
    reward_range: tuple[float, float] | None = None,
    direction_alphas: DirectionAlphas | None = None,
) -> Comparison:
    """The canary's arm against the incumbent's over `units` (in the order they were assigned).
    `direction_alphas`: the sequential method's test per direction (two-sided at 1 - confidence when None)."""
    canary = [unit.value for unit in units if unit.canary]
    incumbent = [unit.value for unit in units if not unit.canary]
    stats = ArmStats.of(canary), ArmStats.of(incumbent)
    # min_samples counts rewarded runs (a client's named group is one unit of several runs), at
    # least two units an arm for the fixed-sample intervals' variances.
    canary_runs = sum(unit.runs for unit in units if unit.canary)
    incumbent_runs = sum(unit.runs for unit in units if not unit.canary)
    if min(len(canary), len(incumbent)) < 2 or min(canary_runs, incumbent_runs) < min_samples:
        return Comparison(*stats, method, confidence, min_samples, INSUFFICIENT)
    if method == "sequential":
        interval = sequential_interval(units, confidence, reward_range, direction_alphas)
    elif method == "welch":
        interval = welch_interval(canary, incumbent, confidence)
    elif method == "bootstrap":
        interval = bootstrap_interval(canary, incumbent, confidence, seed=seed)
    else:
        raise ValueError(f"unknown method {method!r}")
    return Comparison(*stats, method, confidence, min_samples, verdict_of(interval), interval)


# The share of the false-verdict budget spent on the newest versions' own comparisons.
NEWEST_ALPHA_SHARE = 0.2


def alpha_split(alpha: float, *, newest_index: int) -> tuple[float, float]:
    """The alphas of the lineage's interval and of its `newest_index`-th version's own interval.

    The intervals (what the teacher takeover's margins read, and what the evaluation shows) cover
    the lineage's effect with probability at least 1 - its alpha and every newest version's with
    at least 1 - the sum of theirs: (1 - share) alpha + share alpha sum_k 6 / (pi k)^2 = alpha over a
    lineage of any length."""
    newest = alpha * NEWEST_ALPHA_SHARE * 6.0 / (math.pi * max(1, newest_index)) ** 2
    return alpha * (1.0 - NEWEST_ALPHA_SHARE), newest


def decision_alphas(alpha: float, *, newest_index: int) -> tuple[DirectionAlphas, DirectionAlphas]:
    """The lineage's test and its `newest_index`-th version's, per direction, from the budget
    alpha = 1 - confidence. Only what `decide_lineage` acts on is tested:

        lineage "better" (promotes)      alpha / 2
        lineage "worse"  (rejects)       alpha / 2 (1 - NEWEST_ALPHA_SHARE)
        k-th newest "worse" (rejects)    alpha / 2 NEWEST_ALPHA_SHARE 6 / (pi k)^2
        k-th newest "better"             0: never acted on, never tested

    A wrong promotion has probability at most alpha / 2 and a wrong rejection at most
    alpha / 2 (1 - share + share sum_k 6 / (pi k)^2) = alpha / 2, so an A/A canary gets any verdict
    with at most alpha. The rejections' budget is what two-sided tests at `alpha_split`'s alphas
    spent on them; the newest versions' "better" halves, which no rule read, go to the promotion:
    its threshold falls from 2 / (alpha (1 - share)) to 2 / alpha (25 to 20 at confidence 0.9)."""
    _, newest = alpha_split(alpha, newest_index=newest_index)
    return DirectionAlphas(alpha / 2.0, alpha / 2.0 * (1.0 - NEWEST_ALPHA_SHARE)), DirectionAlphas(0.0, newest / 2.0)


def decide(comparison: Comparison, *, mode: str, elapsed_s: float, timeout_s: float) -> str:
    """What the periodic job does with a canary: promote, reject, timeout (reject), wait, review."""
    if mode != "automatic":
        return REVIEW
    if comparison.verdict == BETTER:
        return PROMOTE
    if comparison.verdict == WORSE:
        return REJECT
    return TIMEOUT if elapsed_s >= timeout_s else WAIT


def decide_lineage(lineage: Comparison, newest: Comparison, *, mode: str, elapsed_s: float, timeout_s: float) -> str:
    """The lineage's verdict: a loss of the lineage or of its newest version rejects the
    lineage, a gain of the lineage (the newest version not worse) promotes the newest version.

        worse(lineage) or worse(newest)  -> reject
        better(lineage)                  -> promote
        elapsed >= timeout               -> timeout (reject)
        otherwise                        -> wait
    """
    if mode != "automatic":
        return REVIEW
    if lineage.verdict == WORSE or newest.verdict == WORSE:
        return REJECT
    if lineage.verdict == BETTER:
        return PROMOTE
    return TIMEOUT if elapsed_s >= timeout_s else WAIT


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class AssignedUnit:
    """A unit as stored: its arm's version, when it was assigned, and what the test reads."""

    label: str
    version_id: uuid.UUID | None
    assigned_at: datetime
    unit: Unit


@dataclass(frozen=True)
class CanaryUnits:
    """The units `evaluate_canary` compares: the lineage's (every lineage version against the
    incumbent since the lineage's first canary started) and the newest version's (its own
    units against the incumbent's since it became the canary), each in order of assignment."""

    lineage: list[Unit]
    newest: list[Unit]


async def canary_units(
    connection: AsyncConnection,
    policy: str,
    lineage_ids: Sequence[uuid.UUID],
    newest_id: uuid.UUID,
    newest_since: datetime,
    incumbent_id: uuid.UUID | None,
    since: datetime,
    settled_before: datetime,
    reward_name: str = "reward",
) -> CanaryUnits:
    """The assigned units of the policy's canary experiment, with their current rewards."""
    lineage = set(lineage_ids) | {newest_id}
    query = (
        select(
            trajectories.c.arm_unit,
            trajectories.c.arm,
            trajectories.c.arm_version_id,
            trajectories.c.arm_share,
            trajectories.c.task_key,
            trajectories.c.first_call_at,
            rewards.c.value,
        )
        .join(
            rewards,
            (rewards.c.trajectory_id == trajectories.c.id)
            & (rewards.c.name == reward_name)
            & (rewards.c.status == "linked")
            & rewards.c.superseded_at.is_(None),
        )
        .where(
            trajectories.c.policy == policy,
            trajectories.c.merged_into.is_(None),
            trajectories.c.arm.is_not(None),
            trajectories.c.served,  # exploration's unserved answers are never in an arm
            trajectories.c.first_call_at >= since,
            trajectories.c.first_call_at < settled_before,
            ((trajectories.c.arm == "canary") & trajectories.c.arm_version_id.in_(lineage))
            | ((trajectories.c.arm == "incumbent") & trajectories.c.arm_version_id.is_not_distinct_from(incumbent_id)),
        )
    )
    found: dict[str, tuple[AssignedUnit, list[float]]] = {}
    for label, arm, version_id, share, task, first_call_at, value in await connection.execute(query):
        if value is None or not math.isfinite(value) or share is None or not 0.0 < share < 1.0:
            continue
        entry = found.get(label)
        if entry is None or first_call_at < entry[0].assigned_at:
            unit = Unit(arm == "canary", float(share), task or label, 0.0)
            values = entry[1] if entry else []
            entry = (AssignedUnit(label, version_id, first_call_at, unit), values)
            found[label] = entry
        entry[1].append(float(value))
    ordered = sorted(found.values(), key=lambda item: (item[0].assigned_at, item[0].label))
    units = [
        AssignedUnit(
            a.label, a.version_id, a.assigned_at, dataclasses.replace(a.unit, value=math.fsum(v) / len(v), runs=len(v))
        )
        for a, v in ordered
    ]
    return CanaryUnits(
        lineage=[a.unit for a in units],
        newest=[
            a.unit for a in units if a.assigned_at >= newest_since and (not a.unit.canary or a.version_id == newest_id)
        ],
    )
