"""Is the canary's lineage better than the promoted version? Rewards of the arms, compared.

The arms: trajectories of the policy whose first call was served by a version of the live
lineage (the canary and the versions it superseded), and those served by the incumbent (the
promoted version, or the base model when none is promoted), both since the lineage's first
canary started, so that both arms saw the same period's traffic. A third arm, the newest
version's own trajectories since it became the canary, is compared with the incumbent too: the
version a promotion would make serve must not be significantly worse on its own. Each
trajectory counts once, with its *current* reward of the configured name (status 'linked',
not superseded).

The statistic: an interval on mean(arm) - mean(incumbent), either the always-valid confidence
sequence of `sequential` (method "sequential", the default: valid although the job looks at
every tick) or a fixed-sample interval, Welch's t (closed form, deterministic) or a percentile
bootstrap (seeded, so repeatable); these two are only valid for a single look and inflate false
verdicts when acted on at the first look that excludes 0. Significantly better: the whole
interval is above 0; significantly worse: below 0. Nothing is decided before each arm has
`min_samples`.

The statistics are pure functions (no database) and are unit-tested against known values.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncConnection

from apprentice.promotion.sequential import ArmSummary, confidence_sequence
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


def sequential_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, reward_range: tuple[float, float] | None = None
) -> Interval:
    """The always-valid interval for mean(a) - mean(b) at alpha = 1 - confidence.

    The reward range scales the mixture and bounds the variance: the policy's declared range
    when set, else the smallest range holding every observed reward (both arms)."""
    if reward_range is None:
        values = [*a, *b]
        reward_range = (min(values), max(values)) if values else (0.0, 1.0)
    found = confidence_sequence(ArmSummary.of(a), ArmSummary.of(b), alpha=1.0 - confidence, reward_range=reward_range)
    return Interval(found.difference, found.low, found.high)


def compare(
    canary: Sequence[float],
    incumbent: Sequence[float],
    *,
    method: str = "welch",
    confidence: float = 0.95,
    min_samples: int = 30,
    seed: int = 0,
    reward_range: tuple[float, float] | None = None,
) -> Comparison:
    stats = ArmStats.of(canary), ArmStats.of(incumbent)
    if len(canary) < max(2, min_samples) or len(incumbent) < max(2, min_samples):
        return Comparison(*stats, method, confidence, min_samples, INSUFFICIENT)
    if method == "sequential":
        interval = sequential_interval(canary, incumbent, confidence, reward_range)
    elif method == "welch":
        interval = welch_interval(canary, incumbent, confidence)
    elif method == "bootstrap":
        interval = bootstrap_interval(canary, incumbent, confidence, seed=seed)
    else:
        raise ValueError(f"unknown method {method!r}")
    verdict = BETTER if interval.low > 0 else WORSE if interval.high < 0 else INCONCLUSIVE
    return Comparison(*stats, method, confidence, min_samples, verdict, interval)


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


def _current_rewards(policy: str, since: datetime, reward_name: str, *columns: Any) -> Select[Any]:
    """`columns` and the current reward value of the policy's trajectories started since `since`:
    one row per trajectory with a linked, not superseded reward of `reward_name`."""
    return (
        select(*columns, rewards.c.value)
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
            trajectories.c.first_call_at >= since,
        )
    )


@dataclass(frozen=True)
class LineageRewards:
    """The rewards `evaluate_canary` compares: the lineage's arm and the incumbent's since the
    lineage's first canary started; the newest version's own arm and the incumbent's since the
    newest version became the canary (the same period for both arms of each comparison)."""

    lineage: list[float]
    incumbent: list[float]
    newest: list[float]
    incumbent_since_newest: list[float]


async def lineage_rewards(
    connection: AsyncConnection,
    policy: str,
    lineage_ids: Sequence[uuid.UUID],
    newest_id: uuid.UUID,
    newest_since: datetime,
    incumbent_id: uuid.UUID | None,
    since: datetime,
    reward_name: str = "reward",
) -> LineageRewards:
    """Current rewards of the lineage's, the newest version's and the incumbent's trajectories."""
    lineage = set(lineage_ids) | {newest_id}
    query = _current_rewards(
        policy, since, reward_name, trajectories.c.adapter_version_id, trajectories.c.first_call_at
    ).where(
        trajectories.c.adapter_version_id.in_(lineage)
        | trajectories.c.adapter_version_id.is_not_distinct_from(incumbent_id)
    )
    found = LineageRewards([], [], [], [])
    for version_id, first_call_at, value in await connection.execute(query):
        if value is None or not math.isfinite(value):
            continue
        since_newest = first_call_at >= newest_since
        if version_id in lineage:
            found.lineage.append(float(value))
            if version_id == newest_id and since_newest:
                found.newest.append(float(value))
        else:
            found.incumbent.append(float(value))
            if since_newest:
                found.incumbent_since_newest.append(float(value))
    return found
