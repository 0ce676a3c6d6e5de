"""Promotion lag in simulation: how far behind a learning lineage the promoted version stays.

bench/canary_simulation.py asks how long one canary takes to a verdict when its lineage becomes
better in one step. A live lineage does not step: it gets a little better with every training
run, and each promotion starts a new comparison against the version just promoted. This asks
what users on the promoted version get meanwhile, with the production rule and the shapes of
bench/canary_simulation.py (units at RATE a second, rewards 0.5-8 s late, counted SETTLE_S
after assignment, a look every TICK_S):

- the learner makes a version every VERSION_EVERY runs (the live loop: one GRPO step of 32
  answers, in groups of 8 or not); each is better than its parent by `step` points on every prompt (success
  probability = the prompt's base rate + the version's skill, clipped to [0, 1]), up to `top`;
- the canary always serves the newest version; a promotion makes the newest version at the
  verdict the incumbent and starts the next lineage's comparison from it; a rejection sends
  the learner back to the promoted version (its skill) and starts again;
- the figures: the promoted version's skill at the end against the head's and against what the
  lineage learnt (gain ratio: promoted gain / head gain from the start), the promotions, and
  the lag: runs from the moment the lineage first held a version better than the incumbent to
  the promotion that replaced it, over every promotion.

    python -m bench.promotion_lag                 # 400 replications per row, writes docs/benchmarks.md
    python -m bench.promotion_lag --quick --no-write
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass

from apprentice.promotion import evaluation as ev
from apprentice.promotion.sequential import Unit
from bench.canary_simulation import ALPHA, RATE, SETTLE_S, SHAPES, TICK_S, CanaryLooks, Shape
from bench.report import machine_line, markdown_table, write_section

SECTION_TITLE = "Promotion lag in simulation: the promoted version behind a learning lineage"
VERSION_EVERY = 32  # units a version (the live loop: a GRPO step of 32 answers)


@dataclass(frozen=True)
class Curve:
    """A lineage's learning: `runs` runs of traffic, each version `step` better, up to `top`, from
    the first version trained after `flat_runs` runs (the versions before it are no better)."""

    name: str
    base: tuple[float, float]  # prompts' base success rates, uniform in this range
    step: float
    top: float
    runs: int
    flat_runs: int = 0

    def trained(self, head: float, runs_so_far: int) -> float:
        """The skill of the version trained next from a head of skill `head`, after `runs_so_far` runs."""
        return min(self.top, head + self.step) if runs_so_far >= self.flat_runs else head


def units_a_version(shape: Shape) -> int:
    """Units of `shape` between two training runs (a version every VERSION_EVERY runs)."""
    return max(1, VERSION_EVERY // shape.group)


CURVES = [
    Curve("format task: 1-10% base, +3 pts a version (to +80 pts)", (0.01, 0.10), 0.03, 0.80, 800),
    Curve("content task: 20-60% base, +1 pt a version (to +25 pts)", (0.20, 0.60), 0.01, 0.25, 800),
    # The colour task live: both loops learnt in the last 40% of 640 answers (docs/benchmarks.md).
    Curve(
        "content task, learning late: 20-60% base, flat for 380 of 640 runs, then +6 pts a version (to +30 pts)",
        (0.20, 0.60),
        0.06,
        0.30,
        640,
        flat_runs=380,
    ),
]


@dataclass
class Outcome:
    promoted_skill: float
    head_skill: float
    promotions: int
    rejections: int
    lags: list[int]  # runs from the lineage first holding a better version to its promotion
    gap_sum: float = 0.0  # the sum over units of the head's skill minus the promoted version's
    units: int = 0


def replicate(shape: Shape, curve: Curve, rng: random.Random) -> Outcome:
    """One policy's traffic: a lineage learning at `curve`'s pace, promoted by the production rule."""
    difficulty = [rng.uniform(*curve.base) for _ in range(shape.tasks)]
    incumbent = 0.0  # the promoted version's skill (0: the base model)
    head = 0.0  # the newest version's skill
    looks = CanaryLooks(version=0)  # no canary before the first training run
    outcome = Outcome(0.0, 0.0, 0, 0, [])
    better_since: int | None = None
    next_tick = TICK_S
    every = units_a_version(shape)
    for index in range(curve.runs // shape.group):
        now = index * shape.group / RATE
        if index and index % every == 0:  # a training run lands: the canary moves to it
            head = curve.trained(head, index * shape.group)
            looks.next_version()
            if better_since is None and head > incumbent:
                better_since = index
        outcome.gap_sum += head - incumbent
        outcome.units += 1
        task = rng.randrange(shape.tasks) if shape.tasks else -1
        base = difficulty[task] if shape.tasks else rng.uniform(*curve.base)
        canary = looks.version > 0 and rng.random() < shape.share
        p = min(1.0, max(0.0, base + (head if canary else incumbent)))
        value = sum(rng.random() < p for _ in range(shape.group)) / shape.group
        if looks.version > 0:
            looks.assign(now, Unit(canary, shape.share, str(task if shape.tasks else index), value, shape.group))
        if now < next_tick:
            continue
        next_tick += TICK_S
        decision = looks.look(now)
        if decision not in (ev.PROMOTE, ev.REJECT):
            continue
        if decision == ev.PROMOTE:
            outcome.promotions += 1
            outcome.lags.append((index - (better_since if better_since is not None else index)) * shape.group)
            incumbent = head
        else:
            outcome.rejections += 1
            head = incumbent
        better_since = None
        looks = CanaryLooks(version=0)  # the next lineage starts with the next training run
    outcome.promoted_skill, outcome.head_skill = incumbent, head
    return outcome


def run_row(shape: Shape, curve: Curve, replications: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    outcomes = [replicate(shape, curve, rng) for _ in range(replications)]
    ratios = sorted(o.promoted_skill / o.head_skill for o in outcomes if o.head_skill > 0)
    gaps = [o.head_skill - o.promoted_skill for o in outcomes]
    mean_gaps = [o.gap_sum / o.units for o in outcomes]
    lags = sorted(lag for o in outcomes for lag in o.lags)
    return [
        curve.name.split(":")[0],
        shape.name,
        f"{statistics.median(o.promotions for o in outcomes):.0f}",
        f"{sum(o.promotions == 0 for o in outcomes) / replications:.0%}",
        f"{statistics.fmean(mean_gaps) * 100:.1f} pts",
        f"{statistics.median(gaps) * 100:.1f} pts",
        f"{statistics.median(ratios):.2f}" if ratios else "-",
        f"{ratios[len(ratios) // 10]:.2f}" if ratios else "-",
        f"{statistics.median(lags):.0f} ({statistics.median(lags) / RATE:.0f} s)" if lags else "-",
        f"{sum(o.rejections for o in outcomes) / replications:.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=400, help="replications per row")
    parser.add_argument("--quick", action="store_true", help="20 replications per row, seconds")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    replications = 20 if args.quick else args.replications
    started = time.monotonic()
    rows = []
    for curve_number, curve in enumerate(CURVES):
        for shape_number, shape in enumerate(SHAPES):
            rows.append(run_row(shape, curve, replications, seed=3000 + 10 * curve_number + shape_number))
            print(rows[-1], flush=True)
    body = (
        f"{machine_line()}\n\nCommand: `python -m bench.promotion_lag {' '.join(sys.argv[1:])}` "
        f"({time.monotonic() - started:.0f} s)\n\n"
        f"{replications} replications a row. A version every {VERSION_EVERY} runs, each better than its "
        f"parent by the curve's step on every prompt; {RATE} runs/s, rewards 0.5-8 s late, units counted "
        f"{SETTLE_S:g} s after assignment, a look every {TICK_S:g} s, alpha {ALPHA}, the production rule "
        "(apprentice/promotion/evaluation.py, sequential.py). Gap: the head's skill minus the promoted "
        "version's, averaged over the run's units (what users of the promoted version missed, on average) "
        "and at the end (median). Gain ratio: the promoted version's gain over the base model / the head's "
        "(median, and the 10th percentile). Lag: units (and seconds) from the lineage's first version better "
        "than the incumbent to the promotion, over every promotion.\n\n"
        + markdown_table(
            [
                "curve",
                "shape",
                "promotions",
                "never promoted",
                "mean gap over the run",
                "gap at the end",
                "gain ratio",
                "10th pct",
                "lag, median runs",
                "rejections a run",
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
