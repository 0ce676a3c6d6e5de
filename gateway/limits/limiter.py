"""The request-path decision: admit a call or answer 429, from memory only.

Each gateway process counts what it admitted, per scope (`key:<id>`, `tenant:<name>`) and
window, and holds the other processes' counts as `sync.py` last read them from PostgreSQL.
A call is admitted when, in every scope that has limits, the sliding-window estimate of
requests (and of tokens, with this call's estimate reserved) plus this call stays within the
limit, and the budget window's spend is below the budget. The reservation is corrected by the
upstream's usage when the call ends (`settle`), and the call's cost is added to the spend.

Nothing here awaits: a check is a few dictionary reads, so the limits cost the hot path
microseconds (docs/benchmarks.md, "Limits overhead").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from apprentice.settings import LimitSettings, RateLimits
from gateway.auth.keys import KeyInfo
from gateway.http.errors import GatewayError
from gateway.limits.prices import Prices
from gateway.limits.windows import (
    duration_text,
    estimate,
    seconds_until_empty,
    seconds_until_fits,
    window_index,
)

MINUTE_S = 60
# What a call is assumed to cost in tokens before its usage is known: OpenAI's rule of thumb
# (about four bytes of English text a token), on the whole JSON body.
BYTES_PER_TOKEN = 4


def estimate_tokens(body_bytes: int) -> int:
    return max(1, body_bytes // BYTES_PER_TOKEN)


@dataclass(slots=True)
class Counts:
    """A scope's counts: requests and tokens per minute window, spend per budget window."""

    requests: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    spend: dict[int, float] = field(default_factory=dict)


class Scope(NamedTuple):
    """A limited scope (`key:<id>` or `tenant:<name>`) and its limits."""

    name: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    budget_usd: float | None


class RateLimited(GatewayError):
    """A 429 in OpenAI's format, with the headers that tell a client when to come back."""

    def __init__(self, message: str, *, retry_after_s: float, code: str, error_type: str) -> None:
        super().__init__(429, message, code=code, error_type=error_type)
        self.retry_after_s = retry_after_s
        seconds = max(1, math.ceil(retry_after_s))
        self.headers = [
            (b"retry-after", str(seconds).encode()),
            (b"retry-after-ms", str(max(1, math.ceil(retry_after_s * 1000))).encode()),
        ]


@dataclass(slots=True)
class Admission:
    """An admitted call's reservation, settled with its usage when it ends."""

    scopes: tuple[str, ...]
    minute: int
    reserved_tokens: int
    headers: list[tuple[bytes, bytes]]


NOT_LIMITED = Admission((), 0, 0, [])


class Limiter:
    """This process's counts and its view of the others' (see the module docstring)."""

    def __init__(self, settings: LimitSettings, prices: Prices, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.prices = prices
        self.clock = clock
        self.local: dict[str, Counts] = {}
        self.peers: dict[str, Counts] = {}
        # Set once any scope with limits was checked: until then there is nothing to exchange.
        self.active = settings.key.any or settings.tenant_default.any or any(t.any for t in settings.tenants.values())
        self._scopes: dict[Any, tuple[Mapping[str, Any], str, tuple[Scope, ...]]] = {}

    # ---- which limits apply ----------------------------------------------------------
    def key_limits(self, key: KeyInfo) -> RateLimits:
        """The configured key default, with the key's own overrides (api_keys.limits) on top."""
        if not key.limits:
            return self.settings.key
        return self.settings.key.model_copy(update=dict(key.limits))

    def scopes(self, key: KeyInfo) -> tuple[Scope, ...]:
        """The limited scopes of a key: its own, then its tenant's (memoised per key object's limits)."""
        cached = self._scopes.get(key.id or key.name)
        if cached is not None and cached[0] is key.limits and cached[1] == key.tenant:
            return cached[2]
        found: list[Scope] = []
        for scope, limits in ((f"key:{key.id or key.name}", self.key_limits(key)), (f"tenant:{key.tenant}", None)):
            limits = limits if limits is not None else self.settings.for_tenant(key.tenant)
            if limits.any:
                found.append(Scope(scope, limits.requests_per_minute, limits.tokens_per_minute, limits.budget_usd))
        entries = tuple(found)
        if len(self._scopes) > 100_000:
            self._scopes.clear()
        self._scopes[key.id or key.name] = (key.limits, key.tenant, entries)
        return entries

    # ---- the request path ------------------------------------------------------------
    def _window(self, scope: str, requests: bool, minute: int) -> tuple[float, float]:
        """(previous, current) minute counts of a scope, this process's and the others' together."""
        previous: float = 0
        current: float = 0
        for counts in (self.local.get(scope), self.peers.get(scope)):
            if counts is not None:
                windows = counts.requests if requests else counts.tokens
                previous += windows.get(minute - 1, 0)
                current += windows.get(minute, 0)
        return previous, current

    def admit(self, key: KeyInfo, estimated_tokens: int) -> Admission:
        """Reserve one request and `estimated_tokens` in every limited scope, or raise RateLimited."""
        scopes = self.scopes(key)
        if not scopes:
            return NOT_LIMITED
        self.active = True
        now = self.clock()
        minute = int(now // MINUTE_S)
        elapsed = (now % MINUTE_S) / MINUTE_S
        # (limit, used, cost, previous, current) of the first scope limiting requests / tokens: the headers.
        shown_requests: tuple[int, float, float, float] | None = None
        shown_tokens: tuple[int, float, float, float] | None = None
        for scope in scopes:
            if scope.requests_per_minute is not None:
                previous, current = self._window(scope.name, True, minute)
                used = previous * (1.0 - elapsed) + current
                if used + 1 > scope.requests_per_minute:
                    raise self._refusal(scope.name, "requests", scope.requests_per_minute, previous, current, 1, now)
                if shown_requests is None:
                    shown_requests = (scope.requests_per_minute, used + 1, previous, current + 1)
            if scope.tokens_per_minute is not None:
                previous, current = self._window(scope.name, False, minute)
                used = previous * (1.0 - elapsed) + current
                if used + estimated_tokens > scope.tokens_per_minute:
                    raise self._refusal(
                        scope.name, "tokens", scope.tokens_per_minute, previous, current, estimated_tokens, now
                    )
                if shown_tokens is None:
                    shown_tokens = (
                        scope.tokens_per_minute,
                        used + estimated_tokens,
                        previous,
                        current + estimated_tokens,
                    )
            if scope.budget_usd is not None:
                self._check_budget(scope.name, scope.budget_usd, now)
        for scope in scopes:
            counts = self.local.get(scope.name)
            if counts is None:
                counts = self.local[scope.name] = Counts()
            counts.requests[minute] = counts.requests.get(minute, 0) + 1
            counts.tokens[minute] = counts.tokens.get(minute, 0) + estimated_tokens
        headers: list[tuple[bytes, bytes]] = []
        for name, shown in ((b"requests", shown_requests), (b"tokens", shown_tokens)):
            if shown is not None:
                limit, used, previous, current = shown
                reset = seconds_until_empty(previous, current, now, MINUTE_S)
                headers += [
                    (b"x-ratelimit-limit-" + name, str(limit).encode()),
                    (b"x-ratelimit-remaining-" + name, str(max(0, math.floor(limit - used))).encode()),
                    (b"x-ratelimit-reset-" + name, duration_text(reset).encode()),
                ]
        return Admission(tuple(scope.name for scope in scopes), minute, estimated_tokens, headers)

    def _refusal(
        self, scope: str, kind: str, limit: int, previous: float, current: float, cost: int, now: float
    ) -> RateLimited:
        used = estimate(previous, current, now, MINUTE_S)
        wait = seconds_until_fits(previous, current, cost, limit, now, MINUTE_S)
        unit = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
        too_large = " (this request alone is over the limit)" if cost > limit else ""
        return RateLimited(
            f"Rate limit reached for {scope.replace(':', ' ', 1)} on {unit}: Limit {limit}, Used {math.ceil(used)}, "
            f"Requested {cost}{too_large}. Please try again in {duration_text(wait)}.",
            retry_after_s=wait,
            code="rate_limit_exceeded",
            error_type=kind,
        )

    def _check_budget(self, scope: str, budget: float, now: float) -> None:
        window = self.settings.budget_window_s
        index = window_index(now, window)
        spent = 0.0
        for counts in (self.local.get(scope), self.peers.get(scope)):
            if counts is not None:
                spent += counts.spend.get(index, 0.0)
        if spent >= budget:
            wait = (index + 1) * window - now
            raise RateLimited(
                f"Budget reached for {scope.replace(':', ' ', 1)}: spent ${spent:.4f} of ${budget:.4f} in the "
                f"current {duration_text(window)} window. Please try again in {duration_text(wait)}.",
                retry_after_s=wait,
                code="insufficient_quota",
                error_type="insufficient_quota",
            )

    def settle(
        self, admission: Admission, target: Any, prompt_tokens: int | None, completion_tokens: int | None
    ) -> None:
        """Replace the token estimate with the usage, and add the call's cost to the spend."""
        if not admission.scopes:
            return
        used = (prompt_tokens or 0) + (completion_tokens or 0)
        delta = used - admission.reserved_tokens if used else 0
        cost = self.prices.cost(target, prompt_tokens, completion_tokens) if used else 0.0
        budget_index = window_index(self.clock(), self.settings.budget_window_s)
        for scope in admission.scopes:
            counts = self.local.get(scope)
            if counts is None:
                counts = self.local[scope] = Counts()
            if delta and admission.minute in counts.tokens:
                counts.tokens[admission.minute] = max(0, counts.tokens[admission.minute] + delta)
            if cost:
                counts.spend[budget_index] = counts.spend.get(budget_index, 0.0) + cost

    # ---- what sync.py exchanges ------------------------------------------------------
    def current_indexes(self) -> tuple[int, int]:
        now = self.clock()
        return window_index(now, MINUTE_S), window_index(now, self.settings.budget_window_s)

    def snapshot(self) -> list[tuple[str, int, int, int, int, float]]:
        """This process's live rows (scope, window_s, index, requests, tokens, spend), older
        windows dropped from memory first."""
        minute, budget_index = self.current_indexes()
        budget_window = int(self.settings.budget_window_s)
        rows = []
        for scope, counts in list(self.local.items()):
            for mapping in (counts.requests, counts.tokens):
                for index in [i for i in mapping if i < minute - 1]:
                    del mapping[index]
            for index in [i for i in counts.spend if i < budget_index]:
                del counts.spend[index]
            if not (counts.requests or counts.tokens or counts.spend):
                del self.local[scope]
                continue
            for index in sorted(set(counts.requests) | set(counts.tokens)):
                rows.append((scope, MINUTE_S, index, counts.requests.get(index, 0), counts.tokens.get(index, 0), 0.0))
            for index, spent in counts.spend.items():
                rows.append((scope, budget_window, index, 0, 0, spent))
        return rows

    def set_peers(self, rows: Iterable[tuple[str, int, int, int, int, float]]) -> None:
        """The other processes' summed rows, as read by the last sync."""
        peers: dict[str, Counts] = {}
        for scope, window_s, index, requests, tokens, spend in rows:
            counts = peers.get(scope)
            if counts is None:
                counts = peers[scope] = Counts()
            if window_s == MINUTE_S:
                counts.requests[index] = int(requests)
                counts.tokens[index] = int(tokens)
            else:
                counts.spend[index] = float(spend)
        self.peers = peers
