"""When to send a reward again, and after how long.

A reward post is retried when the gateway could not decide it: 429 (the tenant's pending
rewards are at their bound, or a rate limit), 502/503/504 (PostgreSQL unreachable: the gateway
answers 503 with `Retry-After`; a proxy in front answers 502/504), and when no answer came at
all (connection refused or dropped, timeout). Every other answer is final. Retrying is safe
because every reward carries an idempotency key: a reward the gateway stored before its answer
was lost is answered again, never stored twice.

The wait is exponential backoff with full jitter, and never shorter than the server's
`Retry-After` (seconds or an HTTP date), which is capped at `max_retry_after_s` so that a
misconfigured proxy cannot park the sender for hours.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

RETRY_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts a post gets and how long it waits between them."""

    max_attempts: int = 6
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    max_retry_after_s: float = 120.0
    statuses: frozenset[int] = RETRY_STATUSES

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("backoff times must not be negative")

    def backoff_s(self, attempt: int) -> float:
        """The jittered wait after failed attempt number `attempt` (1-based)."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (attempt - 1))
        return random.uniform(ceiling / 2, ceiling)

    def delay_s(self, attempt: int, retry_after: str | None) -> float:
        """The wait before the next attempt: the backoff, or the server's Retry-After if longer."""
        asked = parse_retry_after(retry_after)
        wait = self.backoff_s(attempt)
        if asked is not None:
            wait = max(wait, min(asked, self.max_retry_after_s))
        return wait


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
