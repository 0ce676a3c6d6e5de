"""The canary's confidence sequence stays valid when it is looked at after every reward.

Simulated canaries, seeded so the figures are repeatable: A/A arms (no true difference) must
be called better or worse at most `alpha` of the time although the test looks after every
new pair of rewards; a true gain of 10 points must be found.
"""

from __future__ import annotations

import random

from apprentice.promotion.sequential import ArmSummary, confidence_sequence

ALPHA = 0.1
MIN_SAMPLES = 16


class RunningArm:
    """Welford's running mean and squared deviations, as rewards arrive one by one."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, value: float) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)

    def summary(self) -> ArmSummary:
        return ArmSummary(self.n, self.mean, self.m2)


def first_verdict(p_canary: float, p_incumbent: float, looks: int, rng: random.Random) -> tuple[str, int]:
    """Look after every pair of Bernoulli rewards; the first decisive look's verdict."""
    canary, incumbent = RunningArm(), RunningArm()
    for _ in range(looks):
        canary.add(float(rng.random() < p_canary))
        incumbent.add(float(rng.random() < p_incumbent))
        if canary.n < MIN_SAMPLES:
            continue
        interval = confidence_sequence(canary.summary(), incumbent.summary(), alpha=ALPHA)
        if interval.low > 0:
            return "better", canary.n
        if interval.high < 0:
            return "worse", canary.n
    return "none", canary.n


def test_a_and_a_arms_are_called_different_at_most_alpha_of_the_time_under_continuous_looks():
    rng = random.Random(20261201)
    for rate in (0.05, 0.5):
        verdicts = [first_verdict(rate, rate, looks=400, rng=rng)[0] for _ in range(300)]
        false_rate = sum(v != "none" for v in verdicts) / len(verdicts)
        assert false_rate <= ALPHA, f"base rate {rate}: {false_rate:.3f} false verdicts at alpha {ALPHA}"


def test_a_true_gain_of_ten_points_is_found_and_never_called_worse():
    rng = random.Random(7)
    results = [first_verdict(0.6, 0.5, looks=1500, rng=rng) for _ in range(100)]
    assert not [r for r in results if r[0] == "worse"]
    found = sorted(n for verdict, n in results if verdict == "better")
    assert len(found) >= 90
    assert found[len(found) // 2] < 600, f"median samples per arm to a verdict: {found[len(found) // 2]}"


def test_the_interval_is_conservative_for_small_arms_and_rates_near_zero():
    none_yet = confidence_sequence(ArmSummary.of([0.0] * 20), ArmSummary.of([0.0] * 20), alpha=ALPHA)
    assert none_yet.low < 0 < none_yet.high, "two arms of zeros are not evidence of anything"
    one_success = confidence_sequence(ArmSummary.of([1.0] + [0.0] * 19), ArmSummary.of([0.0] * 20), alpha=ALPHA)
    assert one_success.low < 0, "one success in twenty against none is no promotion"
    clear = confidence_sequence(
        ArmSummary.of([1.0] * 60 + [0.0] * 40), ArmSummary.of([1.0] * 5 + [0.0] * 95), alpha=ALPHA
    )
    assert clear.low > 0.3
