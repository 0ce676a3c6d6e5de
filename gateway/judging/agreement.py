"""How well an LLM judge ranks each judged group the way the real outcomes (webhook rewards) do.

GRPO only uses the differences within a group, so the judge is measured on exactly that: per
judged group (one judgement: the trajectories the judge read side by side), does it order the
members as their webhook rewards do? Absolute agreement (the same numbers) would not matter and
is not measured. Two figures, both per group and then aggregated:

- Spearman's rank correlation, rho, of the judge's scores against the webhook rewards;
- pairwise accuracy: the share of the pairs that the webhook tells apart which the judge
  orders the same way.

Pairs within one group share members and one judge call, so they are not independent: the
confidence intervals come from a cluster bootstrap that resamples whole groups.

Pure Python on purpose (the gateway has no numpy). One bootstrap draw costs 0.15-0.35 us, so the
number of resamples shrinks with the data (`resamples_for`), and the admin endpoint runs it in
a worker thread so that it never holds the event loop.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

Bucket = Literal["hour", "day"]

CONFIDENCE = 0.95
RESAMPLES = 1000
# Group draws per report, summed over its intervals (overall and per bucket, Spearman and
# pairwise: up to 4 x the groups per resample): at most about half a second of CPU. Up to 500
# groups get RESAMPLES; past that the resamples shrink, never under MIN_RESAMPLES (so past
# 5,000 groups the cost grows again, linearly; `since` bounds it). With that many groups the
# intervals are narrow, and their ends move little with fewer resamples.
DRAW_BUDGET = 2_000_000
MIN_RESAMPLES = 100
SEED = 12  # fixed: the same rows always answer the same interval


@dataclass(frozen=True, slots=True)
class ScoredTrajectory:
    """One trajectory with both a current webhook reward and a current judge score."""

    judgement_id: uuid.UUID  # the group judged together
    trajectory_id: uuid.UUID
    webhook: float
    judge: float
    judged_at: datetime
    judge_model: str
    rubric_hash: str


@dataclass(frozen=True, slots=True)
class GroupAgreement:
    """The figures of one judged group with at least two members that have both values."""

    judgement_id: uuid.UUID
    judged_at: datetime  # the earliest judged-at time of its members (they normally share one)
    members: int
    spearman: float | None  # None: either side is constant within the group
    pair_score: float  # the sum of the pair scores
    pairs: int  # the pairs whose webhook values differ


@dataclass(frozen=True, slots=True)
class Interval:
    """A percentile bootstrap interval."""

    low: float
    high: float


@dataclass(frozen=True, slots=True)
class Figures:
    """Agreement over a set of groups (all of them, or those of one time bucket)."""

    trajectories: int  # trajectories with both values, in groups of any size
    groups: int  # groups with at least two such trajectories
    spearman: float | None  # mean rho over the groups where it is defined
    spearman_groups: int
    spearman_interval: Interval | None
    pairwise_accuracy: float | None  # pooled over every pair of every group
    pairs: int
    pairwise_groups: int  # groups with at least one pair
    pairwise_interval: Interval | None


@dataclass(frozen=True, slots=True)
class BucketFigures:
    start: datetime  # UTC, inclusive
    end: datetime  # exclusive
    figures: Figures


@dataclass(frozen=True, slots=True)
class JudgeSource:
    """A judge model and rubric whose scores contributed, with how much."""

    judge_model: str
    rubric_hash: str
    groups: int  # judgements with at least one trajectory that has both values
    trajectories: int


@dataclass(frozen=True, slots=True)
class AgreementReport:
    overall: Figures
    buckets: list[BucketFigures]  # oldest first; only buckets with at least one trajectory
    sources: list[JudgeSource]  # most trajectories first
    resamples: int  # of every interval in the report


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n in ascending order; tied values share the mean of the ranks they span.

    For values sorted as v_(1) <= ... <= v_(n), a run of ties v_(i) = ... = v_(j) gets the rank
    (i + j) / 2 for each of its members (e.g. [1, 1, 0] -> [2.5, 2.5, 1]).
    """
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        rank = (start + end) / 2 + 1  # positions start..end hold ranks start+1..end+1
        for position in range(start, end + 1):
            ranks[order[position]] = rank
        start = end + 1
    return ranks


def spearman(webhook: Sequence[float], judge: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks (so ties are handled exactly).

        rho = sum_i (a_i - m)(b_i - m) / sqrt(sum_i (a_i - m)^2 * sum_i (b_i - m)^2)

    where a and b are the average ranks of the webhook and judge values and m = (n + 1) / 2 is
    the mean rank of both. Without ties this equals 1 - 6 sum_i (a_i - b_i)^2 / (n (n^2 - 1)).
    None when n < 2 or either side is constant (a zero denominator: no ranking to agree with).
    """
    if len(webhook) != len(judge):
        raise ValueError("webhook and judge values must pair up")
    n = len(webhook)
    if n < 2:
        return None
    a, b = average_ranks(webhook), average_ranks(judge)
    mean = (n + 1) / 2
    covariance = sum((x - mean) * (y - mean) for x, y in zip(a, b, strict=True))
    spread_a = sum((x - mean) ** 2 for x in a)
    spread_b = sum((y - mean) ** 2 for y in b)
    if spread_a == 0 or spread_b == 0:
        return None
    return max(-1.0, min(1.0, covariance / math.sqrt(spread_a * spread_b)))


def pair_scores(webhook: Sequence[float], judge: Sequence[float]) -> tuple[float, int]:
    """The summed pair scores and the number of pairs, over the pairs i < j with w_i != w_j.

        score(i, j) = 1    if sign(j_i - j_j) == sign(w_i - w_j)  (the judge orders them the same way)
                      0.5  if j_i == j_j                          (the judge ties them)
                      0    otherwise                              (the judge orders them the other way)

    Pairs that the webhook ties tell nothing about ordering and are not counted.
    """
    if len(webhook) != len(judge):
        raise ValueError("webhook and judge values must pair up")
    total, pairs = 0.0, 0
    for i in range(len(webhook)):
        for j in range(i + 1, len(webhook)):
            if webhook[i] == webhook[j]:
                continue
            pairs += 1
            if judge[i] == judge[j]:
                total += 0.5
            elif (judge[i] > judge[j]) == (webhook[i] > webhook[j]):
                total += 1.0
    return total, pairs


def score_groups(rows: Iterable[ScoredTrajectory]) -> list[GroupAgreement]:
    """One GroupAgreement per judgement with at least two members, ordered by (judged_at, id)."""
    members: dict[uuid.UUID, list[ScoredTrajectory]] = {}
    for row in rows:
        members.setdefault(row.judgement_id, []).append(row)
    groups = []
    for judgement_id, group in members.items():
        if len(group) < 2:
            continue
        webhook, judge = [r.webhook for r in group], [r.judge for r in group]
        total, pairs = pair_scores(webhook, judge)
        groups.append(
            GroupAgreement(
                judgement_id=judgement_id,
                judged_at=min(r.judged_at for r in group),
                members=len(group),
                spearman=spearman(webhook, judge),
                pair_score=total,
                pairs=pairs,
            )
        )
    groups.sort(key=lambda g: (g.judged_at, g.judgement_id))
    return groups


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values by linear interpolation between closest ranks:
    with h = (B - 1) q, s_floor(h) + (h - floor(h)) (s_floor(h)+1 - s_floor(h)) (0-based)."""
    h = (len(ordered) - 1) * q
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (h - low) * (ordered[high] - ordered[low])


def resamples_for(clusters: int, wanted: int = RESAMPLES) -> int:
    """The resamples of a report whose intervals draw from `clusters` groups in all: `wanted`,
    fewer when `wanted` x `clusters` would pass DRAW_BUDGET, never under MIN_RESAMPLES."""
    return max(min(MIN_RESAMPLES, wanted), min(wanted, DRAW_BUDGET // max(clusters, 1)))


def bootstrap_ratio(
    numerators: Sequence[float], denominators: Sequence[float] | None, *, resamples: int, seed: int = SEED
) -> Interval | None:
    """A 95% percentile cluster-bootstrap interval of sum(numerators) / sum(denominators).

    Each of the B resamples draws n groups with replacement from the n given (g_1..g_n) and
    computes R* = sum_k num[g_k] / sum_k den[g_k]; the interval is the 2.5% and 97.5% percentiles
    of the R* (`percentile`). Denominators None: each is 1, so R* is the resample's mean.
    Denominators must be positive. None under two groups: one group cannot show how much
    groups vary.
    """
    n = len(numerators)
    if n < 2:
        return None
    if denominators is not None and (len(denominators) != n or min(denominators) <= 0):
        raise ValueError("one positive denominator per numerator")
    rng = random.Random(seed)
    statistics = []
    if denominators is None:
        for _ in range(resamples):
            statistics.append(sum(rng.choices(numerators, k=n)) / n)
    else:
        indices = range(n)
        for _ in range(resamples):
            draw = rng.choices(indices, k=n)
            statistics.append(sum(map(numerators.__getitem__, draw)) / sum(map(denominators.__getitem__, draw)))
    statistics.sort()
    tail = (1 - CONFIDENCE) / 2
    return Interval(low=percentile(statistics, tail), high=percentile(statistics, 1 - tail))


def clusters(groups: Sequence[GroupAgreement]) -> int:
    """The groups the two intervals of `summarize` draw from, together (the cost of one resample)."""
    return sum((g.spearman is not None) + (g.pairs > 0) for g in groups)


def summarize(groups: Sequence[GroupAgreement], trajectories: int, *, resamples: int = RESAMPLES) -> Figures:
    """The aggregate figures of some groups.

    - spearman = (1 / G_s) sum_g rho_g over the G_s groups where rho_g is defined (each group
      counts once, whatever its size);
    - pairwise accuracy = sum_g S_g / sum_g P_g, where S_g is the summed pair score and P_g the
      pair count of group g (pooled: every pair counts once, a large group weighs more);
    - each with a 95% percentile bootstrap interval resampling groups (`bootstrap_ratio`: the
      mean is the ratio with denominators 1), drawing from the groups that enter the figure.
    """
    defined = [g.spearman for g in groups if g.spearman is not None]
    paired = [g for g in groups if g.pairs]
    pairs = sum(g.pairs for g in paired)
    return Figures(
        trajectories=trajectories,
        groups=len(groups),
        spearman=sum(defined) / len(defined) if defined else None,
        spearman_groups=len(defined),
        spearman_interval=bootstrap_ratio(defined, None, resamples=resamples),
        pairwise_accuracy=sum(g.pair_score for g in paired) / pairs if pairs else None,
        pairs=pairs,
        pairwise_groups=len(paired),
        pairwise_interval=bootstrap_ratio(
            [g.pair_score for g in paired],
            [float(g.pairs) for g in paired],
            resamples=resamples,
        ),
    )


def bucket_start(at: datetime, bucket: Bucket) -> datetime:
    """The UTC hour or day that `at` falls in (a naive time is taken as UTC)."""
    utc = at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)
    start = utc.replace(minute=0, second=0, microsecond=0)
    return start.replace(hour=0) if bucket == "day" else start


def agreement(rows: Sequence[ScoredTrajectory], *, bucket: Bucket, resamples: int = RESAMPLES) -> AgreementReport:
    """Overall and per-bucket agreement of the given rows, and the judges they came from.

    A group falls in the bucket of its judged-at time (`GroupAgreement.judged_at`), and so do
    its trajectories; each bucket's interval is bootstrapped from that bucket's groups alone.
    Every interval has the same number of resamples: `resamples`, fewer for much data
    (`resamples_for`).
    """
    groups = score_groups(rows)
    judged_at: dict[uuid.UUID, datetime] = {}
    for row in rows:
        known = judged_at.get(row.judgement_id)
        judged_at[row.judgement_id] = row.judged_at if known is None else min(known, row.judged_at)

    trajectories_in: dict[datetime, int] = {}
    for row in rows:
        start = bucket_start(judged_at[row.judgement_id], bucket)
        trajectories_in[start] = trajectories_in.get(start, 0) + 1
    groups_in: dict[datetime, list[GroupAgreement]] = {}
    for group in groups:
        groups_in.setdefault(bucket_start(group.judged_at, bucket), []).append(group)

    # Each group is drawn from twice per resample: overall, and in its bucket.
    resamples = resamples_for(2 * clusters(groups), resamples)
    width = timedelta(days=1) if bucket == "day" else timedelta(hours=1)
    buckets = [
        BucketFigures(start, start + width, summarize(groups_in.get(start, []), count, resamples=resamples))
        for start, count in sorted(trajectories_in.items())
    ]
    return AgreementReport(
        overall=summarize(groups, len(rows), resamples=resamples),
        buckets=buckets,
        sources=judge_sources(rows),
        resamples=resamples,
    )


def judge_sources(rows: Iterable[ScoredTrajectory]) -> list[JudgeSource]:
    """Which (judge model, rubric hash) pairs the rows came from, most trajectories first."""
    judgements: dict[tuple[str, str], set[uuid.UUID]] = {}
    trajectories: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (row.judge_model, row.rubric_hash)
        judgements.setdefault(key, set()).add(row.judgement_id)
        trajectories[key] = trajectories.get(key, 0) + 1
    sources = [
        JudgeSource(judge_model=model, rubric_hash=rubric, groups=len(judgements[(model, rubric)]), trajectories=count)
        for (model, rubric), count in trajectories.items()
    ]
    sources.sort(key=lambda s: (-s.trajectories, s.judge_model, s.rubric_hash))
    return sources
