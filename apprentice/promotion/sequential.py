"""An always-valid confidence sequence for mean(canary) - mean(incumbent).

The promotion job looks at a canary's rewards at every tick and acts on the first look that
decides. A fixed-sample interval (Welch's t) checked that way is wrong far more often than
its nominal level says (Johari, Pekelis, Walsh, "Peeking at A/B Tests", KDD 2017). This
module gives an interval that is valid at every look at once: the normal-mixture sequential
probability ratio test (mSPRT) of Johari, Koomen, Pekelis, Walsh, "Always Valid Inference:
Continuous Monitoring of A/B Tests", Operations Research 70(3), 2022, read as a confidence
sequence (Howard, Ramdas, McAuliffe, Sekhon, Annals of Statistics 2021, the normal mixture
boundary).

With d the difference of the arms' means, V its estimated variance
(var_canary / n_canary + var_incumbent / n_incumbent) and a N(0, tau^2) mixture over the true
difference theta, the mixture likelihood ratio against theta0 is

    Lambda(theta0) = sqrt(V / (V + tau^2)) * exp( tau^2 (d - theta0)^2 / (2 V (V + tau^2)) )

and by Ville's inequality P(exists n: Lambda_n(theta) >= 1/alpha) <= alpha under the true
theta. So the set of theta0 with Lambda(theta0) < 1/alpha is a (1 - alpha) confidence
sequence, the interval

    d +- sqrt( 2 V (V + tau^2) / tau^2 * ( log(1/alpha) + log(sqrt((V + tau^2) / V)) ) ).

Decisions: "better" when the whole interval is above 0, "worse" when below 0, at any look;
the chance that an A/A canary is ever called either is at most alpha (two-sided).

Why these choices:
- tau = TAU_SHARE * (reward range): the boundary is tightest for differences of about that
  size; promotions worth making move rewards by several percent of their range.
- The variance is estimated (the guarantee is then asymptotic, as in Johari et al.), shrunk
  towards the Bhatia-Davis bound (hi - mean)(mean - lo) with PRIOR_WEIGHT pseudo-samples and
  a smoothed mean. Early on, and for rates near 0 or 1 where a sample variance of 0 would
  make the interval collapse, it is conservative; with more samples the data decide.
  tests/test_sequential.py checks the false-decision rate on A/A arms by simulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

TAU_SHARE = 0.1
PRIOR_WEIGHT = 2.0


@dataclass(frozen=True)
class ArmSummary:
    """What the test needs of one arm: count, mean and the sum of squared deviations."""

    n: int
    mean: float
    m2: float

    @classmethod
    def of(cls, values: Sequence[float]) -> ArmSummary:
        n = len(values)
        mean = math.fsum(values) / n if n else 0.0
        return cls(n, mean, math.fsum((v - mean) ** 2 for v in values))

    def shrunk_variance(self, low: float, high: float) -> float:
        """The sample variance shrunk towards the largest variance a bounded reward with this
        (smoothed) mean can have: conservative while the arm is small."""
        middle = (low + high) / 2.0
        smoothed = (self.n * self.mean + PRIOR_WEIGHT * middle) / (self.n + PRIOR_WEIGHT)
        bound = max((high - smoothed) * (smoothed - low), 0.0)
        return (self.m2 + PRIOR_WEIGHT * bound) / (self.n + PRIOR_WEIGHT)


@dataclass(frozen=True)
class ConfidenceSequenceInterval:
    difference: float  # mean(canary) - mean(incumbent)
    low: float
    high: float
    alpha: float


def mixture_half_width(variance: float, tau: float, alpha: float) -> float:
    """Half the width of the normal-mixture confidence sequence at estimated variance V."""
    tau2 = tau * tau
    return math.sqrt(
        2.0
        * variance
        * (variance + tau2)
        / tau2
        * (math.log(1.0 / alpha) + 0.5 * math.log((variance + tau2) / variance))
    )


def confidence_sequence(
    canary: ArmSummary, incumbent: ArmSummary, *, alpha: float, reward_range: tuple[float, float] = (0.0, 1.0)
) -> ConfidenceSequenceInterval:
    """The (1 - alpha) always-valid interval on mean(canary) - mean(incumbent)."""
    low, high = reward_range
    if canary.n == 0 or incumbent.n == 0:
        return ConfidenceSequenceInterval(0.0, -(high - low), high - low, alpha)
    variance = canary.shrunk_variance(low, high) / canary.n + incumbent.shrunk_variance(low, high) / incumbent.n
    difference = canary.mean - incumbent.mean
    if variance <= 0.0:  # both arms constant at a bound even after shrinking: nothing to learn
        return ConfidenceSequenceInterval(difference, difference, difference, alpha)
    half = mixture_half_width(variance, TAU_SHARE * (high - low), alpha)
    return ConfidenceSequenceInterval(difference, difference - half, difference + half, alpha)
