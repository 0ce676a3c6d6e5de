"""An always-valid, nonasymptotic confidence sequence on the canary's effect, by randomised unit.

The canary is an experiment whose units are runs (or the client's groups): each unit is put in
the canary's arm with a known probability p, the policy's canary share at that moment, drawn
independently of its prompt (gateway/policies/versions.py). The promotion job looks at every
tick and acts on the first look that decides, so the interval must hold at every look at once,
and rewards are bounded, so it can hold at every sample size, not only asymptotically.

Per unit i (in order of assignment), with y_i its reward rescaled to [0, 1] and A_i in {0, 1}
its arm:

    b_i = (S_task + m_i) / (n_task + 1)          the task's baseline from earlier units only:
                                                  S_task, n_task the sum and count of earlier
                                                  units of i's task, m_i the mean of all earlier
                                                  units (1/2 before any)
    w_i = A_i / p_i - (1 - A_i) / (1 - p_i)      inverse-probability weight, E[w_i] = 0
    Z_i = w_i * (y_i - b_i)                      a per-unit estimate of the effect on i

Because A_i is drawn with probability p_i independently of everything before it and of i's
prompt, E[Z_i | units before i] = E[y_i(canary) - y_i(incumbent)] = tau_i whatever b_i is; b_i
only removes the task's difficulty from the variance. That is the design-based estimate of
Ham, Bojinov, Lindon, Tingley, "Design-based confidence sequences" (2023), with the task's
running mean as the predictable baseline (a within-task comparison: a task seen before is
compared with its own history; a task seen for the first time with everything before it, the
unstratified comparison). Which prompts each arm happens to get does not enter the mean.

Whichever arm unit i draws, Z_i lies in [L_i, U_i], known before its reward arrives:

    L_i = min(-b_i / p_i, -(1 - b_i) / (1 - p_i))     U_i = max((1 - b_i) / p_i, b_i / (1 - p_i))

and X_i = (Z_i - L_i) / (U_i - L_i) lies in [0, 1]. The confidence sequence is the predictable
plug-in empirical-Bernstein one of Waudby-Smith and Ramdas, "Estimating means of bounded random
variables by betting", JRSS-B 86(1), 2024, Theorem 2, two-sided at alpha:

    mu_hat_t   = (1/2 + sum_{i<=t} X_i) / (t + 1)
    sigma2_t   = (1/4 + sum_{i<=t} (X_i - mu_hat_i)^2) / (t + 1)
    h_t        = max(t, HORIZON)
    lambda_t   = min(LAMBDA_MAX, sqrt(2 log(2/alpha) / (sigma2_{t-1} h_t log(1 + h_t) / log(1 + HORIZON))))
    v_t        = 4 (X_t - mu_hat_{t-1})^2
    psi(l)     = (-log(1 - l) - l) / 4

(WSR's schedule has h_t = t: bets that shrink from the first unit on, so the earliest units,
served by the lineage's oldest versions, would weigh most. Holding the bet at the size that is
tightest after HORIZON units, and shrinking it as WSR does only after that, weighs every unit of
a canary the same until then; any predictable schedule keeps the guarantee. In simulation
(16 tasks of base rates 5-95%, share 0.5, alpha 0.1) a 10-point gain is found in 96% of canaries,
at a median of 464 units, against 45% and 1,113 with WSR's schedule.)

And, with kappa_i = lambda_i / (U_i - L_i) the weight of unit i on the effect's scale,

    estimate   = sum kappa_i Z_i / sum kappa_i
    half width = (log(2/alpha) + sum v_i psi(lambda_i)) / sum kappa_i

The process exp(sum lambda_i (X_i - E[X_i | past]) - v_i psi(lambda_i)) is a nonnegative
supermartingale for any conditional means (Fan, Grama, Liu 2015), so by Ville's inequality the
interval covers the kappa-weighted average of the units' effects tau_i at every t at once with
probability 1 - alpha: exact for every sample size, not asymptotic, and valid when the effect
changes over time (the canary moving along its lineage). Under A/A every tau_i is 0, so the
chance that any look calls the canary better or worse is at most alpha.

The verdicts are a test by betting on the same per-unit estimates (the interval above describes
the effect's size and serves margins, as the teacher takeover's; the test decides, and is the
sharper of the two at 0). For each direction s (+1: "better", -1: "worse"), with

    d_i = s Z_i / (U_i - L_i)                    in [s_lo_i, s_lo_i + 1], s_lo_i = L_i / (U_i - L_i)
                                                  for s = +1, -U_i / (U_i - L_i) for s = -1
    lambda_i = clip(M1_{i-1} / (M2_{i-1} + G_{i-1} BET_PRIOR_UNITS v_{i-1}), 0, BET_CAP / -s_lo_i)
    M1_i = gamma^r_i M1_{i-1} + d_i,   M2_i = gamma^r_i M2_{i-1} + d_i^2,   M1_0 = M2_0 = 0
    G_i  = gamma^r_i G_{i-1},  G_0 = 1            r_i: the runs unit i's value is the mean of
    v_i  = (1/4 + sum_{j<=i} d_j^2) / (1 + i)     the mean square of d so far (1/4 before any unit)
    W_t  = prod_{i<=t} (1 + lambda_i d_i)

(lambda_i is the approximate growth-rate-optimal bet E[d] / E[d^2], aGRAPA in Waudby-Smith and
Ramdas 2024, Section 5.1, on a window of about 1 / (1 - gamma) = BET_WINDOW runs so that it follows
a lineage whose newer versions are better. The window is counted in runs, not units, because the
lineage moves with the runs it trains on: a window of 200 units of named groups of 8 was 1,600
runs, longer than a whole 800-run stretch, so a lineage whose first versions were worse had its
bets held at 0 long after it got better. It is 100 runs rather than 200 because a lineage often
gets better late and in a few versions (on the colour task both the live and the bare loop learnt
in the last 40% of 640 answers), and the bets must grow within a few dozen group units of that:
in bench/promotion_lag.py's rows (400 replications, same seeds) 100 runs shortened the median lag
in all eight (format, groups of 8: 368 -> 360 runs; content, runs: 604 -> 583) and, on its
late-learning curve, promoted more lineages within the run (see docs/benchmarks.md); 50 runs did
worse than either, its bets following the noise of a few units. The prior, BET_PRIOR_UNITS units of the mean square
seen so far, keeps the first bets small: with a prior of one unit, 2 of 40 simulated lineages
whose gain grows from 0 were called worse in their first 80 units, with 20 none, at the same
power. It is counted in units of what the units have shown, not of the largest variance a unit
can have (1/4), because most units vary far less: a group's mean of 8 rewards, or a format task
whose rewards are nearly all 0 at the start, has a mean square of d of 0.01-0.05, and a prior of
20 x 1/4 then outweighed 100-500 real units and held the bets far below E[d] / E[d^2] while the
lineage was already much better. Replayed on a live loop's canary (lowercase task, 16 prompts in
named groups of 8, a lineage that jumped from 5% to 67% at its 13th version), the test called it
better at unit 53 instead of 65, 50 s sooner; v_i is known before d_i, so the bets stay
predictable.)

The cap, BET_CAP = 0.9 of the wealth at risk on one unit (WSR use 1/2 or 3/4), binds where units
vary far less than their range allows, which is what a group's mean does: d of a group unit spans
[-1/2, 1/2] but varies by a few hundredths, so E[d] / E[d^2] asks for bets far above any cap and
the cap alone sets the pace. In bench/promotion_lag.py (16 prompts in named groups of 8, 100
replications a row, same seeds) the cap at 0.9 with the window in runs took a content-like
lineage (+1 point a version) from 60% never promoted to 25%, and a format-like one (+3 points)
from a median lag of 480 runs to 376; shapes whose units are single runs did not move. Every
factor is at least 1 - BET_CAP > 0 and lambda_i is known before d_i, so when every unit's
effect is at most 0 (tau_i <= 0 for s = +1, >= 0 for s = -1), E[d_i | past] <= 0 and W is a
nonnegative supermartingale with W_0 = 1: by Ville's inequality it ever reaches 2 / alpha with
probability at most alpha / 2 (Shafer, "Testing by betting", JRSS-A 2021; Waudby-Smith and Ramdas
2024, Section 4). "Better" when W(+1) >= 2 / alpha, "worse" when W(-1) >= 2 / alpha: under A/A at
most alpha of canaries get any verdict at any look. (Any split of alpha between the directions
keeps this: the promotion job gives each verdict the budget evaluation.decision_alphas sets, and a
direction decides at 1 / its alpha.) On a live loop's unique-prompt canary (a
lineage 2% -> 10% on its traffic; the lineage's alpha 0.08) W(+1) passed 2 / alpha at unit 654,
when the interval was [-0.013, +0.094], and it still held 0 at the last unit, 710.

bench/canary_simulation.py measures the false-verdict rate over 10,000 simulated A/A canaries
(prompts of unequal difficulty, late rewards, new versions arriving) and the time to a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

# WSR's cap on the bet: at most 3/4 of the wealth on one unit.
LAMBDA_MAX = 0.75
# Units after which the bets start to shrink (see the module's docstring).
HORIZON = 500
# The test's bets: at most this share of the wealth at risk on one unit, sized from a window of
# about BET_WINDOW recent runs (see the module's docstring).
BET_CAP = 0.9
BET_WINDOW = 100
BET_PRIOR_UNITS = 20


@dataclass(frozen=True)
class Unit:
    """One randomised unit as the test reads it."""

    canary: bool  # the arm drawn for it: the canary's (lineage's) or the incumbent's
    share: float  # the probability it had of the canary's arm when it was drawn, in (0, 1)
    stratum: str  # its task: units of one task are compared with their own history
    value: float  # its reward (the mean over its runs), in the policy's reward range
    runs: int = 1  # the runs its value is the mean of: the bets' memory is counted in runs


@dataclass(frozen=True)
class EffectInterval:
    difference: float  # the weighted average effect estimate, on the reward's scale
    low: float
    high: float
    alpha: float
    units: int
    # The test's wealth against "no gain" and against "no loss" (W(+1), W(-1) in the docstring).
    wealth_better: float = 1.0
    wealth_worse: float = 1.0

    @property
    def threshold(self) -> float:
        """The wealth at which the test decides: 2 / alpha (alpha / 2 to each direction)."""
        return 2.0 / self.alpha

    @property
    def verdict(self) -> str | None:
        """The test's verdict, "better" or "worse", or None while it has not decided (not the interval's)."""
        if self.wealth_better >= self.threshold:
            return "better"
        if self.wealth_worse >= self.threshold:
            return "worse"
        return None


@dataclass
class _Bettor:
    """One direction's test by betting (W(s) in the module's docstring)."""

    sign: float
    log_wealth: float = 0.0
    first_moment: float = 0.0  # M1
    second_moment: float = 0.0  # M2
    prior_units: float = BET_PRIOR_UNITS  # gamma^(i-1) BET_PRIOR_UNITS: the prior decays as M2's terms do
    squares: float = 0.25  # 1/4 + sum d_j^2: v_i's numerator
    seen: int = 1  # 1 + i: v_i's denominator

    def add(self, z: float, lower: float, upper: float, runs: int = 1) -> None:
        width = upper - lower
        d = self.sign * z / width
        lowest = (lower if self.sign > 0 else -upper) / width  # < 0 for any b_i: L_i < 0 < U_i always
        mean_square = self.squares / self.seen  # v_{i-1}
        prior = self.prior_units * mean_square
        bet = min(max(self.first_moment / (self.second_moment + prior), 0.0), BET_CAP / -lowest)
        self.log_wealth += math.log1p(bet * d)
        decay = (1.0 - 1.0 / BET_WINDOW) ** runs  # the window is BET_WINDOW runs, whatever a unit holds
        self.first_moment = decay * self.first_moment + d
        self.second_moment = decay * self.second_moment + d * d
        self.prior_units *= decay
        self.squares += d * d
        self.seen += 1


@dataclass
class EffectSequence:
    """The confidence sequence, updated one unit at a time (the order of assignment)."""

    alpha: float
    reward_range: tuple[float, float] = (0.0, 1.0)
    # running state of the baseline
    _task_sums: dict[str, tuple[float, int]] = field(default_factory=dict)
    _all_sum: float = 0.0
    _count: int = 0
    # running state of the empirical-Bernstein sequence (on X in [0, 1])
    _x_sum: float = 0.0
    _sq_dev_sum: float = 0.0
    _weight_sum: float = 0.0  # sum kappa_i
    _weighted_z: float = 0.0  # sum kappa_i Z_i
    _penalty: float = 0.0  # sum v_i psi(lambda_i)
    # the test by betting, one bettor a direction
    _better: _Bettor = field(default_factory=lambda: _Bettor(1.0))
    _worse: _Bettor = field(default_factory=lambda: _Bettor(-1.0))

    def add(self, unit: Unit) -> None:
        if not 0.0 < unit.share < 1.0:
            raise ValueError(f"a unit's share must be in (0, 1), got {unit.share}")
        low, high = self.reward_range
        y = min(1.0, max(0.0, (unit.value - low) / (high - low)))
        task_sum, task_n = self._task_sums.get(unit.stratum, (0.0, 0))
        overall = self._all_sum / self._count if self._count else 0.5
        baseline = (task_sum + overall) / (task_n + 1)
        p = unit.share
        z = (y - baseline) / p if unit.canary else -(y - baseline) / (1.0 - p)
        # Z's range whichever arm the unit drew (known before its reward: b and p are)
        lower = min(-baseline / p, -(1.0 - baseline) / (1.0 - p))
        upper = max((1.0 - baseline) / p, baseline / (1.0 - p))
        x = (z - lower) / (upper - lower)
        self._better.add(z, lower, upper, unit.runs)
        self._worse.add(z, lower, upper, unit.runs)

        t = self._count + 1
        mu_before = (0.5 + self._x_sum) / t  # mu_hat_{t-1}
        sigma2_before = (0.25 + self._sq_dev_sum) / t  # sigma2_{t-1}
        h = max(t, HORIZON)
        lam = min(
            LAMBDA_MAX,
            math.sqrt(2.0 * math.log(2.0 / self.alpha) / (sigma2_before * h * math.log1p(h) / math.log1p(HORIZON))),
        )
        kappa = lam / (upper - lower)
        self._weight_sum += kappa
        self._weighted_z += kappa * z
        self._penalty += 4.0 * (x - mu_before) ** 2 * (-math.log1p(-lam) - lam) / 4.0

        self._x_sum += x
        mu_now = (0.5 + self._x_sum) / (t + 1)  # mu_hat_t
        self._sq_dev_sum += (x - mu_now) ** 2
        self._task_sums[unit.stratum] = (task_sum + y, task_n + 1)
        self._all_sum += y
        self._count = t

    def interval(self) -> EffectInterval:
        scale = self.reward_range[1] - self.reward_range[0]
        if self._count == 0:
            return EffectInterval(0.0, -scale, scale, self.alpha, 0)
        estimate = self._weighted_z / self._weight_sum
        half = (math.log(2.0 / self.alpha) + self._penalty) / self._weight_sum
        return EffectInterval(
            estimate * scale,
            (estimate - half) * scale,
            (estimate + half) * scale,
            self.alpha,
            self._count,
            math.exp(min(self._better.log_wealth, 700.0)),
            math.exp(min(self._worse.log_wealth, 700.0)),
        )


def confidence_sequence(
    units: Iterable[Unit], *, alpha: float, reward_range: tuple[float, float] = (0.0, 1.0)
) -> EffectInterval:
    """The (1 - alpha) always-valid interval on the canary's average effect after `units`
    (in the order they were assigned)."""
    sequence = EffectSequence(alpha, reward_range)
    for unit in units:
        sequence.add(unit)
    return sequence.interval()
