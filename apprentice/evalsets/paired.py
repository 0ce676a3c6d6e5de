"""The evaluation gate's statistic: a paired one-sided t-test of non-inferiority (pure functions).

Both versions answer the same items, so each item gives one difference d_i = candidate_i -
promoted_i. Pairing removes the items' own difficulty from the comparison (an item both get
right or both get wrong says nothing about which is better), which makes the test far more
sensitive than comparing the two means as independent samples: Miller, "Adding Error Bars to
Evals: A Statistical Approach to Language Model Evaluations" (arXiv:2411.00640, 2024), section 4,
recommends exactly this paired analysis of per-question score differences for comparing two
models on one eval.

Hypotheses (non-inferiority, the burden of proof on the candidate):

    H0: mean(d) <= -margin   (the candidate is worse by at least the margin)
    H1: mean(d) >  -margin

The candidate passes when the one-sided (1 - alpha) lower confidence bound of mean(d),
mean - t_{1-alpha, n-1} * s/sqrt(n), is above -margin. So a version truly worse by the margin or
more passes with probability at most alpha, however many items the set has: it "never serves"
at that error rate. The paired t-test for non-inferiority and its sample size are textbook:
Julious, "Sample sizes for clinical trials with normal data", Statistics in Medicine 23 (2004),
1921-1986, section 4 (one-sided non-inferiority, paired); Wellek, "Testing Statistical
Hypotheses of Equivalence and Noninferiority" (2nd ed., 2010), chapter 5.

Why the t-test and not Wilcoxon's signed-rank test: the set measures a mean score, and the
signed-rank test answers a question about the median of the differences while throwing their
sizes away; why not McNemar's: scores are not always 0/1 (the judge's and reward functions'
are continuous). For 0/1 scores the differences take -1, 0 and 1, and the t statistic is the
large-sample test of a paired difference in proportions (with few items it is approximate).

Power: the chance that a candidate exactly as good as the promoted version (mean(d) = 0) passes,
1 - T_{n-1}(t_{1-alpha, n-1} - margin * sqrt(n) / s), with the non-central t approximated by a
shifted central t (Julious 2004, eq. 4). A set too small or too noisy for the stated power is
reported with the number of items it would need (n = ((z_{1-alpha} + z_power) s / margin)^2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

from apprentice.promotion.evaluation import t_cdf, t_ppf

__all__ = ["PairedTest", "non_inferiority"]

MIN_ITEMS = 2


@dataclass(frozen=True)
class PairedTest:
    n: int
    mean_candidate: float
    mean_incumbent: float
    mean_difference: float
    sd_difference: float
    lower_bound: float  # the one-sided (1 - alpha) lower confidence bound of mean(d)
    margin: float
    alpha: float
    power: float  # the chance a version as good as the incumbent passes, with this set
    required_power: float
    items_for_power: int | None  # items the stated power needs (None: no estimate, zero variance)
    passed: bool

    @property
    def underpowered(self) -> bool:
        return self.power < self.required_power

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "underpowered": self.underpowered, "test": "paired one-sided t (non-inferiority)"}

    def summary(self) -> str:
        return (
            f"mean {self.mean_candidate:.4f} vs {self.mean_incumbent:.4f} on {self.n} items, paired difference "
            f"{self.mean_difference:+.4f}, {1 - self.alpha:.0%} lower bound {self.lower_bound:+.4f} "
            f"vs margin -{self.margin:g}, power {self.power:.2f}"
        )


def non_inferiority(
    candidate: Sequence[float], incumbent: Sequence[float], *, margin: float, alpha: float, power: float
) -> PairedTest:
    """The paired test of `candidate` (scores by item) against `incumbent` (same items, same order)."""
    if len(candidate) != len(incumbent):
        raise ValueError("the two versions must be scored on the same items")
    n = len(candidate)
    if n < MIN_ITEMS:
        raise ValueError(f"a paired test needs at least {MIN_ITEMS} items, the set has {n}")
    differences = [c - i for c, i in zip(candidate, incumbent, strict=True)]
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    se = sd / math.sqrt(n)
    critical = t_ppf(1.0 - alpha, n - 1)
    if se == 0.0:  # every item moved by the same amount: the difference is known exactly
        lower, achieved, needed = mean, 1.0, None
    else:
        lower = mean - critical * se
        achieved = 1.0 - t_cdf(critical - margin / se, n - 1)
        z = NormalDist().inv_cdf(1.0 - alpha) + NormalDist().inv_cdf(power) if power > 0 else 0.0
        needed = max(MIN_ITEMS, math.ceil((z * sd / margin) ** 2))
    return PairedTest(
        n=n,
        mean_candidate=sum(candidate) / n,
        mean_incumbent=sum(incumbent) / n,
        mean_difference=mean,
        sd_difference=sd,
        lower_bound=lower,
        margin=margin,
        alpha=alpha,
        power=achieved,
        required_power=power,
        items_for_power=needed,
        passed=lower > -margin,
    )
