"""The promotion ceiling: how often any valid test could call a learning lineage better within the run.

bench/promotion_lag.py measures how often the production rule promotes a lineage that learns at a
given pace. When it does not, is the rule to blame or the data? This bench answers with a bound
that holds for every test, sequential or not, that keeps a false promotion below alpha_better
(the production rule's budget for "better", evaluation.decision_alphas: ALPHA / 2):

- Take one lineage from promotion_lag's curves and shapes, with no promotion: the units a run
  sends, the canary from the first trained version on, each unit in the canary's arm with
  probability p (the share), the canary's success probability q1 = base + the head's skill on
  each prompt, the incumbent's q0 = base.
- Any such test is also a level-alpha_better test of one simple null inside "no gain": both arms
  succeed with the same probability m = p q1 + (1 - p) q0 on each unit (the member of the null
  closest to the truth in Kullback-Leibler divergence, for a binomial unit). Against that simple
  null and the true alternative, the most powerful test of the run's data is the likelihood
  ratio's (Neyman-Pearson), so its power bounds every valid test's chance of a promotion by the
  end, the production rule's included (its first promotion is such a rejection, made on a subset
  of the same units):

      log LR = sum over the canary's units  k log(q_A / m) + (n - k) log((1 - q_A) / (1 - m))

  with A the unit's arm, k its successes out of its n runs. The single-look ceiling rejects when
  log LR at the end exceeds its (1 - alpha_better) quantile under the null, taken from the exact
  per-unit null means and variances (a normal approximation for a sum of dozens to hundreds of
  independent units; the column "size" checks it by drawing the null).
- The sequential ceiling is the same likelihood ratio watched at every unit, promoting once it
  reaches 1 / alpha_better: the growth-optimal test by betting for this alternative (a test that
  knows the truth), which is what an always-valid rule could at best do.

- The design-based ceiling is what the production rule's own kind of test could do if it knew
  the truth. The rule's null is "no gain on average" for rewards of any bounded distribution, and
  its bets are payoffs linear in the unit's mean reward y, valid for every such null:
  g(y) = a + c y in the canary's arm and (1 - p g(y)) / (1 - p) in the incumbent's, with a >= 0,
  c >= 0 and a + c <= 1 / p (so neither is ever negative); the rule's bet 1 + lambda w (y - b)
  is this family with a = 1 - lambda b / p, c = lambda / p. Each unit here gets the (a, c) that
  maximises E log payoff under its true q1, q0 (a grid of 161 x 161, the rates rounded to 0.01
  for the choice; any choice is valid), the growth-optimal bet of Waudby-Smith and Ramdas 2024
  for this alternative, and the lineage is promoted once the wealth reaches 1 / alpha_better.

The single-look figure bounds every rule; the likelihood ratio's shows what a sequential test
that knew the truth and the rewards' distribution could do; the design-based one, what the rule's
test could do if it knew each unit's rates and the effect. The production rule has to learn both
from the same units. All are for the first lineage only: the production rule's later promotions
(promotion_lag's "promotions") are on top of its first.

    python -m bench.promotion_ceiling                 # 2,000 replications a row, writes docs/benchmarks.md
    python -m bench.promotion_ceiling --quick --no-write
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from bench.canary_simulation import ALPHA, SHAPES, Shape
from bench.promotion_lag import CURVES, Curve, replicate, units_a_version
from bench.report import machine_line, markdown_table, write_section

SECTION_TITLE = "Promotion ceiling: how often any valid test could promote a learning lineage"
ALPHA_BETTER = ALPHA / 2  # evaluation.decision_alphas: the budget of "the lineage is better"
Z_ONE_SIDED = statistics.NormalDist().inv_cdf(1.0 - ALPHA_BETTER)  # the single-look test's normal quantile
EDGE = 1e-3  # success probabilities are kept in [EDGE, 1 - EDGE] so that every log is finite
BET_GRID = 161  # points per axis of the design-based bets' (a, c) grid


# promotion_lag's curves, and the colour task as it learnt live: the bare loop gained 11 points
# from 640 answers (24.6% -> 35.5%, seed 0) and the live lineages' heads 12-15 points, both in the
# last 40% of the run (docs/benchmarks.md, "Learning efficiency").
CURVES_HERE = [
    *CURVES,
    Curve(
        "content task as the colour task learnt live: 20-60% base, flat for 380 of 640 runs, then +3 pts a "
        "version (to +15 pts)",
        (0.20, 0.60),
        0.03,
        0.15,
        640,
        flat_runs=380,
    ),
]


@dataclass(frozen=True)
class Ceiling:
    single_look: float  # share of replications where the Neyman-Pearson test rejects at the end
    sequential: float  # share where the likelihood ratio reaches 1 / ALPHA_BETTER at some unit
    size: float  # the single-look test's rejections under its null (should be near ALPHA_BETTER)
    design_based: float  # share where the growth-optimal linear bets that know the truth reach 1 / ALPHA_BETTER
    units: int  # canary units in a run (both arms)


def head_skill(curve: Curve, shape: Shape) -> np.ndarray:
    """The lineage head's skill at each unit, as promotion_lag.replicate moves it (no promotion),
    and NaN before the first trained version (no canary serves yet)."""
    units = curve.runs // shape.group
    every = units_a_version(shape)
    skill = np.full(units, np.nan)
    head = 0.0
    for index in range(every, units):
        if index % every == 0:
            head = curve.trained(head, index * shape.group)
        skill[index] = head
    return skill


def unit_log_ratio(successes: np.ndarray, runs: int, q: np.ndarray, m: np.ndarray) -> np.ndarray:
    """log Bin(k; n, q) / Bin(k; n, m): one unit's log likelihood ratio (the binomial coefficients cancel)."""
    return successes * np.log(q / m) + (runs - successes) * np.log((1.0 - q) / (1.0 - m))


def binomial_pmf(runs: int, q: float) -> np.ndarray:
    return np.array([math.comb(runs, k) * q**k * (1.0 - q) ** (runs - k) for k in range(runs + 1)])


def best_linear_bet(q1: float, q0: float, runs: int, share: float) -> tuple[float, float]:
    """The (a, c) of the valid linear payoff with the largest E log under the true rates (see the docstring)."""
    mean_reward = np.arange(runs + 1) / runs
    a = np.linspace(0.0, 1.0 / share, BET_GRID)[:, None, None]
    c = np.linspace(0.0, 1.0 / share, BET_GRID)[None, :, None]
    canary_pay = a + c * mean_reward
    incumbent_pay = (1.0 - share * canary_pay) / (1.0 - share)
    with np.errstate(divide="ignore", invalid="ignore"):
        growth = share * (binomial_pmf(runs, q1) * np.log(canary_pay)).sum(-1) + (1.0 - share) * (
            binomial_pmf(runs, q0) * np.log(incumbent_pay)
        ).sum(-1)
    growth = np.where(np.isfinite(growth), growth, -np.inf)  # a payoff of 0 (or below) where it can happen
    best_a, best_c = np.unravel_index(int(np.argmax(growth)), growth.shape)
    return float(a[best_a, 0, 0]), float(c[0, best_c, 0])


def design_based_paths(
    q1: np.ndarray, q0: np.ndarray, canary: np.ndarray, successes: np.ndarray, runs: int, share: float
) -> np.ndarray:
    """The log wealth, unit by unit, of the growth-optimal linear bets chosen with the true rates."""
    rates = np.stack([np.round(q1, 2), np.round(q0, 2)], axis=-1).reshape(-1, 2)
    pairs, which = np.unique(rates, axis=0, return_inverse=True)
    bets = np.array([best_linear_bet(*np.clip(pair, EDGE, 1.0 - EDGE), runs, share) for pair in pairs])
    a = bets[which.ravel(), 0].reshape(q1.shape)
    c = bets[which.ravel(), 1].reshape(q1.shape)
    canary_pay = a + c * successes / runs
    payoff = np.where(canary, canary_pay, (1.0 - share * canary_pay) / (1.0 - share))
    return np.cumsum(np.log(payoff), axis=1)


def ceiling(curve: Curve, shape: Shape, replications: int, seed: int) -> Ceiling:
    rng = np.random.default_rng(seed)
    skill = head_skill(curve, shape)
    serving = ~np.isnan(skill)
    skill = skill[serving]
    units, n, p = skill.size, shape.group, shape.share
    if shape.tasks:
        difficulty = rng.uniform(*curve.base, size=(replications, shape.tasks))
        base = np.take_along_axis(difficulty, rng.integers(shape.tasks, size=(replications, units)), axis=1)
    else:
        base = rng.uniform(*curve.base, size=(replications, units))
    q0 = np.clip(base, EDGE, 1.0 - EDGE)
    q1 = np.clip(base + skill, EDGE, 1.0 - EDGE)
    m = p * q1 + (1.0 - p) * q0
    canary = rng.random((replications, units)) < p
    q_arm = np.where(canary, q1, q0)

    # Under the null each arm succeeds with probability m: the per-unit mean and variance of the
    # log ratio, exact (it is linear in k), mixed over the arm.
    def arm_moments(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        slope = np.log(q / m) - np.log((1.0 - q) / (1.0 - m))
        mean = n * m * np.log(q / m) + n * (1.0 - m) * np.log((1.0 - q) / (1.0 - m))
        return mean, n * m * (1.0 - m) * slope**2

    mean1, var1 = arm_moments(q1)
    mean0, var0 = arm_moments(q0)
    null_mean = p * mean1 + (1.0 - p) * mean0
    null_var = p * var1 + (1.0 - p) * var0 + p * (1.0 - p) * (mean1 - mean0) ** 2
    critical = null_mean.sum(axis=1) + Z_ONE_SIDED * np.sqrt(null_var.sum(axis=1))

    successes = rng.binomial(n, q_arm)
    path = np.cumsum(unit_log_ratio(successes, n, q_arm, m), axis=1)
    design_based = design_based_paths(q1, q0, canary, successes, n, p)
    null_arm = np.where(rng.random((replications, units)) < p, q1, q0)
    under_null = unit_log_ratio(rng.binomial(n, m), n, null_arm, m).sum(axis=1)
    return Ceiling(
        single_look=float(np.mean(path[:, -1] > critical)),
        sequential=float(np.mean(path.max(axis=1) >= math.log(1.0 / ALPHA_BETTER))),
        size=float(np.mean(under_null > critical)),
        design_based=float(np.mean(design_based.max(axis=1) >= math.log(1.0 / ALPHA_BETTER))),
        units=units,
    )


def shipped_promoted(curve: Curve, shape: Shape, replications: int, seed: int) -> float:
    """The production rule's share of runs with a promotion by the end (promotion_lag's replicate)."""
    rng = random.Random(seed)
    return statistics.fmean(replicate(shape, curve, rng).promotions > 0 for _ in range(replications))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=2000, help="replications a row for the ceilings")
    parser.add_argument("--rule-replications", type=int, default=400, help="replications a row for the rule")
    parser.add_argument("--quick", action="store_true", help="200 / 20 replications a row, seconds")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    replications, rule_replications = (200, 20) if args.quick else (args.replications, args.rule_replications)
    started = time.monotonic()
    rows = []
    for curve_number, curve in enumerate(CURVES_HERE):
        for shape_number, shape in enumerate(SHAPES):
            seed = 3000 + 10 * curve_number + shape_number  # promotion_lag's seeds: the same rule rows
            bound = ceiling(curve, shape, replications, seed)
            rule = shipped_promoted(curve, shape, rule_replications, seed)
            rows.append(
                [
                    curve.name.split(":")[0],
                    shape.name,
                    bound.units,
                    f"{rule:.0%}",
                    f"{bound.design_based:.0%}",
                    f"{bound.sequential:.0%}",
                    f"{bound.single_look:.0%}",
                    f"{bound.size:.1%}",
                ]
            )
            print(rows[-1], flush=True)
    body = (
        f"{machine_line()}\n\nCommand: `python -m bench.promotion_ceiling {' '.join(sys.argv[1:])}` "
        f"({time.monotonic() - started:.0f} s)\n\n"
        "bench/promotion_lag.py's curves and shapes, and the colour task's live curve, one lineage from the base "
        "model, no promotion. "
        f"Promoted by the end: the production rule ({rule_replications} replications, promotion_lag's seeds), "
        f"and three ceilings ({replications} replications) for a promotion at alpha {ALPHA_BETTER:g} "
        f'(the rule\'s budget for "better" at confidence {1 - ALPHA:g}). Two watch every unit: the '
        "growth-optimal linear (design-based) bets chosen with each unit's true rates, and the likelihood ratio "
        "of the true alternative against the closest equal-arms null. The third, the Neyman-Pearson test of the "
        "whole run's data at one look at the end, bounds every valid test. Size: the single-look test's "
        "rejections when its null is drawn (its level, to check the normal approximation of its critical "
        "value). The ceilings see each unit's reward at once; the rule waits for it and for its settle time, "
        "and looks every few seconds, as in production. The curves: "
        + "; ".join(curve.name for curve in CURVES_HERE)
        + ".\n\n"
        + markdown_table(
            [
                "curve",
                "shape",
                "canary units",
                "promoted by the end: the rule",
                "the rule's kind of test, knowing the truth",
                "likelihood ratio, knowing the truth",
                "single-look ceiling (any test)",
                "size",
            ],
            rows,
        )
        + "\n"
    )
    print(body)
    if not args.no_write:
        write_section(SECTION_TITLE, body)


if __name__ == "__main__":
    main()
