"""The canary's test in simulation: false verdicts on A/A canaries, and time to promotion.

Each replication is one lineage's canary, simulated the way the promotion job sees it:
- units (runs, or groups of GROUP runs with a group id) arrive at RATE a second and are put
  in the canary's arm with probability SHARE, independently of their prompt;
- prompts repeat (TASKS prompts, base success rates drawn uniformly from 5% to 95%) or never
  repeat (a fresh base rate for every unit);
- rewards arrive 0.5-8 s after the unit, and a unit enters the comparison once it is SETTLE_S
  old (`promotion.settle_s`, `apprentice up`'s 10 s);
- the lineage produces a new version every VERSION_EVERY units and the canary moves to it;
- every TICK_S the job looks and acts on the first decisive look, with the production rule:
  `evaluation.alpha_split`, `evaluation.decision_alphas`, `evaluation.decide_lineage`, `sequential.EffectSequence` (the
  lineage's units since its first canary, and the newest version's since it became the canary).

A/A: every version equals the incumbent; the share of replications with any verdict (promote or
reject as worse) must stay within alpha plus two standard errors. Time to promotion: the lineage
equals the incumbent for its first LATE_VERSIONS versions and is better by `gain` from then on;
the figure is the units (and seconds at RATE) from the first better version's start to the
promotion.

    python -m bench.canary_simulation                 # 10,000 A/A replications per shape, writes docs/benchmarks.md
    python -m bench.canary_simulation --quick --no-write
    python -m bench.canary_simulation --replications 0 --budget two-sided --no-write   # power only, the old budget

Each power replication draws from its own seed, so two rules compared with the same arguments meet the same traffic
replication by replication (a replication that decides sooner does not shift the random stream of the next).
`--budget two-sided` runs the rule before commit e290f55 (each test two-sided at `evaluation.alpha_split`'s alphas,
promotion at a wealth of 25 at confidence 0.9), for such comparisons; the default is the production rule.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass

from apprentice.promotion import evaluation as ev
from apprentice.promotion.sequential import EffectSequence, Unit
from bench.report import machine_line, markdown_table, write_section

SECTION_TITLE = "Canary test in simulation: false verdicts and time to promotion"
ALPHA = 0.1  # apprentice up: promotion.confidence 0.9
MIN_SAMPLES = 16  # apprentice up: promotion.min_samples
RATE = 1.5  # units a second (the live loop's pace)
SETTLE_S = 10.0
TICK_S = 2.0
VERSION_EVERY = 64
TASKS = 16
GROUP = 8
MAX_UNITS = 1500
LATE_VERSIONS = 3


@dataclass(frozen=True)
class Shape:
    name: str
    tasks: int  # 0: prompts never repeat
    group: int  # runs per unit
    share: float


SHAPES = [
    Shape("16 repeating prompts, runs", TASKS, 1, 0.5),
    Shape("16 repeating prompts, groups of 8", TASKS, GROUP, 0.5),
    Shape("prompts that never repeat, runs", 0, 1, 0.5),
    Shape("4 repeating prompts, runs, share 0.2", 4, 1, 0.2),
]


def comparison(
    sequence: EffectSequence, arms: list[int], alpha: float, direction_alphas: ev.DirectionAlphas
) -> ev.Comparison:
    """The promotion job's Comparison of one sequence (insufficient before MIN_SAMPLES an arm)."""
    stats = ev.ArmStats(arms[1], None, None), ev.ArmStats(arms[0], None, None)
    if min(arms) < MIN_SAMPLES:
        return ev.Comparison(*stats, "sequential", 1 - alpha, MIN_SAMPLES, ev.INSUFFICIENT)
    interval = ev.sequential_result(sequence.interval(), direction_alphas)
    return ev.Comparison(*stats, "sequential", 1 - alpha, MIN_SAMPLES, ev.verdict_of(interval), interval)


BUDGETS = ("acted", "two-sided")
BUDGET_WORDS = {
    "acted": "alpha / 2 for promotions, alpha / 2 for rejections: evaluation.decision_alphas",
    "two-sided": "each test two-sided at evaluation.alpha_split's alphas: the rule before e290f55",
}


def two_sided_alphas(alpha: float, *, newest_index: int) -> tuple[ev.DirectionAlphas, ev.DirectionAlphas]:
    """The rule before e290f55: the lineage's and the newest version's tests each two-sided at their alpha."""
    lineage, newest = ev.alpha_split(alpha, newest_index=newest_index)
    return ev.DirectionAlphas.two_sided(lineage), ev.DirectionAlphas.two_sided(newest)


class CanaryLooks:
    """The promotion job's view of one lineage's canary: each assigned unit waits SETTLE_S, and
    each look adds the settled ones to the lineage's sequence (every version since its first
    canary) and to the newest version's, then decides by the production rule."""

    def __init__(self, version: int = 1, budget: str = "acted") -> None:
        self.decision_alphas = ev.decision_alphas if budget == "acted" else two_sided_alphas
        self.lineage_alpha = ev.alpha_split(ALPHA, newest_index=1)[0]
        self.lineage, self.lineage_arms = EffectSequence(self.lineage_alpha), [0, 0]
        self.version = version  # the newest version's index in the lineage (0: none serves yet)
        self.newest, self.newest_arms = EffectSequence(self.newest_alpha()), [0, 0]
        self.pending: list[tuple[float, Unit, int]] = []  # (assigned at, unit, version) not settled yet

    def newest_alpha(self) -> float:
        return ev.alpha_split(ALPHA, newest_index=max(1, self.version))[1]

    def next_version(self) -> None:
        """The lineage's next version becomes the canary: a new newest-version test."""
        self.version += 1
        self.newest, self.newest_arms = EffectSequence(self.newest_alpha()), [0, 0]

    def assign(self, now: float, unit: Unit) -> None:
        self.pending.append((now, unit, self.version))

    def look(self, now: float) -> str:
        """A tick: the units settled by `now` enter, and the decision (promote, reject, wait)."""
        while self.pending and self.pending[0][0] <= now - SETTLE_S:
            _, unit, unit_version = self.pending.pop(0)
            self.lineage.add(unit)
            self.lineage_arms[unit.canary] += unit.runs  # min_samples counts runs
            if unit_version == self.version:
                self.newest.add(unit)
                self.newest_arms[unit.canary] += unit.runs
        lineage_test, newest_test = self.decision_alphas(ALPHA, newest_index=max(1, self.version))
        return ev.decide_lineage(
            comparison(self.lineage, self.lineage_arms, self.lineage_alpha, lineage_test),
            comparison(self.newest, self.newest_arms, self.newest_alpha(), newest_test),
            mode="automatic",
            elapsed_s=now,
            timeout_s=math.inf,
        )


def replicate(shape: Shape, gain: float, rng: random.Random, budget: str = "acted") -> tuple[str, int]:
    """One lineage's canary: (decision, units from the first better version's start to it)."""
    difficulty = [rng.uniform(0.05, 0.95) for _ in range(shape.tasks)]
    looks = CanaryLooks(budget=budget)
    better_from = LATE_VERSIONS * VERSION_EVERY if gain else 0
    next_tick = TICK_S
    for index in range(MAX_UNITS):
        now = index / RATE
        if index and index % VERSION_EVERY == 0:  # the canary moves to the lineage's next version
            looks.next_version()
        task = rng.randrange(shape.tasks) if shape.tasks else -1
        base = difficulty[task] if shape.tasks else rng.uniform(0.05, 0.95)
        canary = rng.random() < shape.share
        effect = gain if canary and index >= better_from else 0.0
        p = min(1.0, base + effect)
        value = sum(rng.random() < p for _ in range(shape.group)) / shape.group
        looks.assign(now, Unit(canary, shape.share, str(task if shape.tasks else index), value, shape.group))
        if now < next_tick:
            continue
        next_tick += TICK_S
        decision = looks.look(now)
        if decision in (ev.PROMOTE, ev.REJECT):
            return decision, index - better_from
    return "none", MAX_UNITS - better_from


def run_shape(shape: Shape, gain: float, replications: int, seed: int, budget: str = "acted") -> list[tuple[str, int]]:
    """A/A replications share one random stream (the figures of record since 2026-12-01 used it)."""
    rng = random.Random(seed)
    return [replicate(shape, gain, rng, budget) for _ in range(replications)]


def run_paired(shape: Shape, gain: float, replications: int, seed: int, budget: str = "acted") -> list[tuple[str, int]]:
    """Power replications, each from its own seed: the same traffic whatever the rule decides."""
    return [replicate(shape, gain, random.Random(seed * 100_000 + j), budget) for j in range(replications)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=10_000, help="A/A replications per shape")
    parser.add_argument("--power-replications", type=int, default=400, help="replications per gain and shape")
    parser.add_argument("--quick", action="store_true", help="40 A/A and 8 power replications, seconds")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument(
        "--budget", choices=BUDGETS, default="acted", help="the production rule, or the two-sided one before e290f55"
    )
    args = parser.parse_args()
    if args.budget != "acted":
        args.no_write = True  # docs/benchmarks.md's section is the production rule's
    replications = 40 if args.quick else args.replications
    power_replications = 8 if args.quick else args.power_replications
    started = time.monotonic()
    aa_rows, power_rows = [], []
    for number, shape in enumerate(SHAPES):
        if replications:  # 0: the power rows only
            results = run_shape(shape, 0.0, replications, seed=1000 + number, budget=args.budget)
            false = sum(decision != "none" for decision, _ in results)
            rate = false / replications
            se = math.sqrt(ALPHA * (1 - ALPHA) / replications)
            aa_rows.append(
                [
                    shape.name,
                    replications,
                    sum(d == ev.PROMOTE for d, _ in results),
                    sum(d == ev.REJECT for d, _ in results),
                    f"{rate:.2%}",
                    f"{ALPHA + 2 * se:.2%}",
                    "yes" if rate <= ALPHA + 2 * se else "NO",
                ]
            )
            print(aa_rows[-1], flush=True)
        for gain in (0.1, 0.2, 0.3):
            seed = 2000 + number * 10 + int(gain * 10)
            results = run_paired(shape, gain, power_replications, seed, budget=args.budget)
            units = sorted(n for decision, n in results if decision == ev.PROMOTE)
            median = statistics.median(units) if units else math.nan
            power_rows.append(
                [
                    shape.name,
                    f"+{gain:.0%}".replace("%", " pts"),
                    f"{len(units) / power_replications:.0%}",
                    f"{sum(d == ev.REJECT for d, _ in results) / power_replications:.1%}",
                    f"{median:.0f}",
                    f"{median / RATE:.0f} s" if units else "-",
                    f"{units[int(0.9 * (len(units) - 1))]:.0f}" if units else "-",
                ]
            )
            print(power_rows[-1], flush=True)
    body = (
        f"{machine_line()}\n\nCommand: `python -m bench.canary_simulation {' '.join(sys.argv[1:])}` "
        f"({time.monotonic() - started:.0f} s)\n\n"
        f"Alpha {ALPHA} ({BUDGET_WORDS[args.budget]}), at least {MIN_SAMPLES} rewarded runs an arm, "
        f"a look every {TICK_S:g} s at "
        f"{RATE} units/s, rewards 0.5-8 s late, units counted {SETTLE_S:g} s after assignment, a new "
        f"lineage version every {VERSION_EVERY} units (each a new newest-version test), prompts' base "
        "rates uniform in 5-95%. A/A: every version equals the incumbent; a verdict is any promotion or "
        f"rejection as worse within {MAX_UNITS} units.\n\n"
        + markdown_table(
            ["shape", "replications", "promoted", "rejected", "false verdicts", "alpha + 2 SE", "within"], aa_rows
        )
        + f"\n\nTime to promotion: the lineage equals the incumbent for {LATE_VERSIONS} versions "
        f"({LATE_VERSIONS * VERSION_EVERY} units), then every new unit of the canary's arm is better by the gain; "
        "units counted from that moment to the promotion (of every unit, both arms); each replication from its own "
        "seed.\n\n"
        + markdown_table(
            ["shape", "gain", "promoted", "rejected", "median units", "median time", "90th pct units"],
            power_rows,
        )
        + "\n"
    )
    print(body)
    if not args.no_write:
        write_section(SECTION_TITLE, body)


if __name__ == "__main__":
    main()
