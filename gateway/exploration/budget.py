"""The exploration budget: extra generated tokens in any sliding hour, per policy.

A request reserves its worst case (k answers x its max_tokens) before it is sent and settles to
what was generated once answered, so the tokens generated in any hour never exceed the budget,
however the answers turn out. A request whose worst case does not fit is not sent. Kept in the
gateway process's memory: each process has its own budget (docs/exploration.md).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 3600.0


@dataclass(slots=True, eq=False)  # compared by identity: two reservations may look alike
class Reservation:
    at: float
    tokens: int


class HourlyTokenBudget:
    """At most `tokens_per_hour` reserved in any window of WINDOW_S seconds."""

    def __init__(self, tokens_per_hour: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.tokens_per_hour = tokens_per_hour
        self.clock = clock
        self._entries: deque[Reservation] = deque()
        self._used = 0
        self.generated_total = 0  # tokens actually generated, all time (this process)

    def _expire(self, now: float) -> None:
        while self._entries and now - self._entries[0].at >= WINDOW_S:
            self._used -= self._entries.popleft().tokens

    def used(self) -> int:
        """Tokens reserved or spent in the last hour."""
        self._expire(self.clock())
        return self._used

    def reserve(self, tokens: int) -> Reservation | None:
        """Reserve `tokens` now, or None when they do not fit the last hour's remainder."""
        now = self.clock()
        self._expire(now)
        if tokens <= 0 or self._used + tokens > self.tokens_per_hour:
            return None
        reservation = Reservation(now, tokens)
        self._entries.append(reservation)
        self._used += tokens
        return reservation

    def settle(self, reservation: Reservation, generated: int) -> None:
        """Shrink a reservation to what was generated (never grows it: the worst case bounded it)."""
        generated = max(0, min(generated, reservation.tokens))
        self.generated_total += generated
        if reservation in self._entries:  # not yet expired: give back what was not used
            self._used -= reservation.tokens - generated
        reservation.tokens = generated
