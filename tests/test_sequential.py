"""The canary's confidence sequence stays valid when it is looked at after every unit.

Simulated canaries, seeded so the figures are repeatable. Units are runs of prompts of unequal
difficulty, each put in the canary's arm with the canary share independently of its prompt (as
the gateway does). A/A arms (no true difference) must be called better or worse at most `alpha`
of the time although the test looks after every unit; true gains must be found, on repeating
prompts and on prompts that never repeat, and never called worse. bench/canary_simulation.py
runs the same with 10,000 replications, late rewards and versions arriving.
"""

from __future__ import annotations

import random

import pytest

from apprentice.promotion.sequential import EffectSequence, Unit, confidence_sequence

ALPHA = 0.1
MIN_UNITS = 16


def first_verdict(
    effect: float, rng: random.Random, *, units: int, tasks: int, share: float = 0.5, ramp: int = 0
) -> tuple[str, int]:
    """Look after every unit; the first decisive look's verdict and the units seen then.

    `effect` is the canary's gain in success rate; with `ramp`, the gain grows linearly from 0
    over the first `ramp` units (a lineage whose newer versions are better)."""
    difficulty = [rng.uniform(0.05, 0.95) for _ in range(tasks)] if tasks else []
    sequence = EffectSequence(ALPHA)
    arms = [0, 0]
    for index in range(units):
        task = rng.randrange(tasks) if tasks else index
        base = difficulty[task] if tasks else rng.uniform(0.05, 0.95)
        canary = rng.random() < share
        gain = effect * min(1.0, (index + 1) / ramp) if ramp else effect
        success = rng.random() < min(1.0, base + (gain if canary else 0.0))
        sequence.add(Unit(canary, share, str(task), float(success)))
        arms[canary] += 1
        if min(arms) < MIN_UNITS:
            continue
        verdict = sequence.interval().verdict  # the test by betting, as the promotion job reads it
        if verdict is not None:
            return verdict, index + 1
    return "none", units


@pytest.mark.parametrize(("tasks", "share"), [(16, 0.5), (4, 0.2), (0, 0.5)])
def test_a_and_a_arms_are_called_different_at_most_alpha_of_the_time_under_continuous_looks(tasks, share):
    rng = random.Random(20261201 + tasks)
    verdicts = [first_verdict(0.0, rng, units=600, tasks=tasks, share=share)[0] for _ in range(250)]
    false_rate = sum(v != "none" for v in verdicts) / len(verdicts)
    assert false_rate <= ALPHA, f"{tasks} tasks, share {share}: {false_rate:.3f} false verdicts at alpha {ALPHA}"


@pytest.mark.parametrize("tasks", [16, 0])
def test_a_gain_of_fifteen_points_is_found_on_repeating_and_on_unique_prompts(tasks):
    rng = random.Random(7 + tasks)
    results = [first_verdict(0.15, rng, units=1500, tasks=tasks) for _ in range(60)]
    assert not [r for r in results if r[0] == "worse"]
    found = sorted(n for verdict, n in results if verdict == "better")
    assert len(found) >= 57, f"found in {len(found)} of 60"
    assert found[len(found) // 2] < 600, f"median units to a verdict: {found[len(found) // 2]}"


def test_a_lineage_that_gets_better_as_it_trains_is_found_and_never_called_worse():
    rng = random.Random(11)
    results = [first_verdict(0.25, rng, units=1500, tasks=16, ramp=400) for _ in range(40)]
    assert not [r for r in results if r[0] == "worse"]
    assert sum(r[0] == "better" for r in results) >= 38


def group_units(rng: random.Random, rates: list[tuple[float, float]], *, group: int = 8) -> list[Unit]:
    """Named groups of `group` runs on 16 prompts, share 0.5: a unit a group, its value the mean
    of its runs' successes; `rates` gives (canary, incumbent) success rates, one pair a unit."""
    units = []
    for canary_rate, incumbent_rate in rates:
        canary = rng.random() < 0.5
        rate = canary_rate if canary else incumbent_rate
        successes = sum(rng.random() < rate for _ in range(group))
        units.append(Unit(canary, 0.5, str(rng.randrange(16)), successes / group, runs=group))
    return units


def test_a_lineage_in_named_groups_that_was_worse_and_got_better_is_found_within_fifty_groups():
    """A live loop's runs of two calls in named groups of 8 (400 runs, 50 units): the lineage's
    first versions are worse than the incumbent, then far better. Its bets remember runs, not
    units, and may risk 0.9 of the wealth on a group (a group's mean varies far less than its
    range). Found in 37 of these 40 stretches; with a window of 200 units and a cap of 1/2, 7."""
    rng = random.Random(5)
    stretch = [(0.02, 0.25)] * 12 + [(0.22, 0.10)] * 13 + [(0.45, 0.05)] * 12 + [(0.66, 0.04)] * 13
    verdicts = []
    for _ in range(40):
        sequence = EffectSequence(0.08)
        verdict = None
        for unit in group_units(rng, stretch):
            sequence.add(unit)
            verdict = verdict or sequence.interval().verdict
        verdicts.append(verdict)
    assert "worse" not in verdicts
    assert verdicts.count("better") >= 30, f"found in {verdicts.count('better')} of 40"


def test_a_and_a_group_units_are_called_different_at_most_alpha_of_the_time():
    rng = random.Random(8)
    verdicts = []
    for _ in range(300):
        sequence = EffectSequence(ALPHA)
        base = [rng.uniform(0.05, 0.95) for _ in range(16)]
        verdict = None
        for unit in group_units(rng, [(0.0, 0.0)] * 200):
            task = int(unit.stratum)
            value = sum(rng.random() < base[task] for _ in range(8)) / 8
            sequence.add(Unit(unit.canary, 0.5, unit.stratum, value, runs=8))
            verdict = verdict or sequence.interval().verdict
        verdicts.append(verdict)
    false_rate = sum(v is not None for v in verdicts) / len(verdicts)
    assert false_rate <= ALPHA, f"{false_rate:.3f} false verdicts at alpha {ALPHA}"


def test_which_prompts_each_arm_got_does_not_decide():
    """The canary's arm holds only hard prompts, the incumbent's only easy ones (an extreme
    draw): the plain difference of means is -0.6, the within-task estimate sees no difference."""
    units = []
    for round_ in range(60):
        units.append(Unit(True, 0.5, "hard", float(round_ % 5 == 0)))  # 20%
        units.append(Unit(False, 0.5, "easy", float(round_ % 5 != 0)))  # 80%
    interval = confidence_sequence(units, alpha=ALPHA)
    assert interval.low < 0 < interval.high


def test_the_interval_is_conservative_for_small_arms_and_rates_near_zero():
    def units(canary: list[float], incumbent: list[float]) -> list[Unit]:
        out = []
        for a, b in zip(canary, incumbent, strict=True):
            out += [Unit(True, 0.5, "t", a), Unit(False, 0.5, "t", b)]
        return out

    none_yet = confidence_sequence(units([0.0] * 20, [0.0] * 20), alpha=ALPHA)
    assert none_yet.low < 0 < none_yet.high, "two arms of zeros are not evidence of anything"
    one_success = confidence_sequence(units([1.0] + [0.0] * 19, [0.0] * 20), alpha=ALPHA)
    assert one_success.low < 0, "one success in twenty against none is no promotion"
    clear = confidence_sequence(units([1.0] * 60 + [0.0] * 40, [1.0] * 5 + [0.0] * 95), alpha=ALPHA)
    assert clear.low > 0.2


def test_the_test_by_betting_finds_a_rare_success_gain_the_interval_still_holds_zero_on():
    """A live loop's unique-prompt canary: successes are rare in both arms (2% against 9%), so
    the interval, whose width is set by the units' range, still holds 0 when the bets have won."""
    rng = random.Random(3)
    sequence = EffectSequence(ALPHA)
    decided_at = None
    for index in range(900):
        canary = rng.random() < 0.5
        sequence.add(Unit(canary, 0.5, f"prompt {index}", float(rng.random() < (0.09 if canary else 0.02))))
        found = sequence.interval()
        if decided_at is None and found.verdict is not None:
            decided_at, interval_then = index + 1, found
    assert decided_at is not None and interval_then.verdict == "better", "a 7-point gain at 2% is found in 900 units"
    assert interval_then.low < 0 < interval_then.high, "where the interval alone would still wait"
    assert interval_then.wealth_better >= interval_then.threshold == 2 / ALPHA  # two-sided at alpha
    assert interval_then.wealth_worse < 1, "the bets against a loss lost"


def test_a_share_outside_the_open_interval_is_refused():
    with pytest.raises(ValueError, match="share"):
        EffectSequence(ALPHA).add(Unit(True, 1.0, "t", 1.0))
