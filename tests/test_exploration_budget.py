"""The exploration budget (gateway/exploration/budget.py): worst cases reserved, settled to what
was generated, and never more than the budget in any sliding hour."""

from __future__ import annotations

import random

from gateway.exploration.budget import WINDOW_S, HourlyTokenBudget


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reservations_settle_and_expire_after_an_hour():
    clock = Clock()
    budget = HourlyTokenBudget(100, clock=clock)
    first = budget.reserve(60)
    assert first is not None and budget.reserve(60) is None, "the worst case must fit"
    budget.settle(first, 25)  # generated less than reserved: the rest is given back
    assert budget.used() == 25 and budget.generated_total == 25
    clock.now = 10.0
    second = budget.reserve(75)
    assert second is not None and budget.used() == 100 and budget.reserve(1) is None
    clock.now = WINDOW_S - 1
    assert budget.reserve(1) is None
    clock.now = WINDOW_S  # the first reservation leaves the window
    assert budget.used() == 75 and budget.reserve(25) is not None
    budget.settle(second, 500)  # never grows past the reservation
    assert budget.generated_total == 100


def test_no_sliding_hour_ever_holds_more_than_the_budget():
    clock = Clock()
    budget = HourlyTokenBudget(1000, clock=clock)
    rng = random.Random(1)
    spent: list[tuple[float, int]] = []
    for _ in range(5000):
        clock.now += rng.expovariate(1 / 5.0)
        reservation = budget.reserve(rng.randint(1, 200))
        if reservation is not None:
            generated = rng.randint(0, reservation.tokens)
            budget.settle(reservation, generated)
            spent.append((clock.now, generated))
    assert spent
    for start, _ in spent:
        assert sum(tokens for at, tokens in spent if start <= at < start + WINDOW_S) <= 1000
