"""The inference endpoints of each policy: fixed entries as written, DNS names as last resolved.

Both the gateway and the promotion job read a policy's endpoints from here, so they agree on
which replicas exist. The gateway refreshes every `refresh_s` in a background worker and
reads the result from memory on each call (never a lookup on a call's path); the promotion job
calls `current_endpoints`, which looks up only the names not refreshed for `refresh_s`.

A lookup that fails, or finds no address, keeps the last known addresses: a DNS outage or a
moment with no ready pod must not drop every endpoint of a policy (its calls would all fail),
and a replica that really went away is skipped by the gateway's failover until the name
answers again. A name that never resolved has no endpoints: the gateway answers its calls
503 naming the policy, the promotion job waits rather than loading anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from apprentice.discovery.entries import DnsName, dns_names, parse_entry
from apprentice.discovery.lookup import Lookup, LookupFailed
from apprentice.settings import EndpointDiscoverySettings, PolicySettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NameState:
    """What is known of one DNS name; replaced whole on each lookup (safe across threads)."""

    addresses: tuple[str, ...] | None = None  # None: never resolved to any address
    attempted_at: float | None = None  # time.monotonic() of the last lookup, good or not
    resolved_at: float | None = None  # of the last lookup that found addresses
    consecutive_failures: int = 0
    last_error: str | None = None


@dataclass
class RefreshResult:
    """One refresh: the names whose addresses changed, and those whose lookup failed or was empty."""

    looked_up: list[str] = field(default_factory=list)
    changed: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)  # host: (old, new)
    failed: dict[str, str] = field(default_factory=dict)  # host: why (the last known set was kept)

    def describe_failures(self, directory: EndpointDirectory) -> str:
        return "; ".join(
            f"{host} (kept {len(directory.addresses(host) or ())} known address(es)): {reason}"
            for host, reason in self.failed.items()
        )


class EndpointDirectory:
    """The last resolved addresses of every DNS name, and each policy's endpoints from them."""

    def __init__(self, config: EndpointDiscoverySettings, lookup: Lookup | None = None) -> None:
        self.config = config
        self.lookup = lookup or Lookup(config.nameservers, config.timeout_s)
        self._names: dict[str, NameState] = {}
        # Bumped when any name's addresses change: readers rebuild what they derived only then.
        self.generation = 0

    # ---- reads (memory only) -------------------------------------------------------------
    def addresses(self, host: str) -> tuple[str, ...] | None:
        state = self._names.get(host)
        return state.addresses if state is not None else None

    def state(self, host: str) -> NameState:
        return self._names.get(host) or NameState()

    def endpoints(self, policy: PolicySettings) -> list[str]:
        """The policy's base URLs in configured order: fixed entries, and each DNS entry's
        addresses as last resolved (none for a name that never resolved); no duplicates."""
        urls: list[str] = []
        for entry in map(parse_entry, policy.endpoints):
            if isinstance(entry, DnsName):
                urls.extend(entry.url(address) for address in self.addresses(entry.host) or ())
            else:
                urls.append(entry)
        return list(dict.fromkeys(urls))

    def unresolved(self, policy: PolicySettings) -> list[str]:
        """The policy's DNS entries that never resolved to an address."""
        return [entry.entry for entry in dns_names(policy.endpoints) if self.addresses(entry.host) is None]

    # ---- refresh -----------------------------------------------------------------------
    async def refresh(self, policies: Iterable[PolicySettings], *, only_stale: bool = False) -> RefreshResult:
        """Look up the DNS names of `policies` concurrently (with `only_stale`, only those not
        looked up within `refresh_s`) and keep what they found; see the module's docstring for
        what a failed or empty lookup does."""
        now = time.monotonic()
        hosts = {entry.host for policy in policies for entry in dns_names(policy.endpoints)}
        if only_stale:
            hosts = {host for host in hosts if self._stale(host, now)}
        result = RefreshResult(looked_up=sorted(hosts))
        outcomes = await asyncio.gather(*(self._lookup(host) for host in result.looked_up))
        for host, outcome in zip(result.looked_up, outcomes, strict=True):
            self._record(host, outcome, time.monotonic(), result)
        if result.changed:
            self.generation += 1
        return result

    def _stale(self, host: str, now: float) -> bool:
        attempted = self.state(host).attempted_at
        return attempted is None or now - attempted >= self.config.refresh_s

    async def _lookup(self, host: str) -> tuple[str, ...] | str:
        try:
            return await self.lookup.addresses(host)
        except LookupFailed as exc:
            return str(exc)
        except Exception as exc:  # a resolver bug must not end the refresh of the other names
            log.exception("looking up %s failed unexpectedly", host)
            return f"{type(exc).__name__}: {exc}"

    def _record(self, host: str, outcome: tuple[str, ...] | str, now: float, result: RefreshResult) -> None:
        old = self.state(host)
        if isinstance(outcome, str) or not outcome:
            reason = outcome if isinstance(outcome, str) else "no A or AAAA record (no ready replica?)"
            result.failed[host] = reason
            self._names[host] = NameState(old.addresses, now, old.resolved_at, old.consecutive_failures + 1, reason)
            return
        if outcome != old.addresses:
            result.changed[host] = (old.addresses or (), outcome)
        self._names[host] = NameState(outcome, now, now, 0, None)


_shared: dict[tuple[object, ...], EndpointDirectory] = {}
_shared_lock = threading.Lock()


def shared_directory(config: EndpointDiscoverySettings) -> EndpointDirectory:
    """The process's directory for this configuration: the gateway's refresh worker and the
    promotion actions its admin API runs read the same addresses."""
    key = (config.refresh_s, config.timeout_s, tuple(config.nameservers))
    with _shared_lock:
        directory = _shared.get(key)
        if directory is None:
            directory = _shared[key] = EndpointDirectory(config)
        return directory


async def current_endpoints(config: EndpointDiscoverySettings, policy: PolicySettings) -> tuple[list[str], list[str]]:
    """(endpoints, unresolved DNS entries) of a policy for the promotion job: its names looked
    up again when older than `refresh_s`; a policy with fixed entries only costs nothing."""
    if not dns_names(policy.endpoints):
        return list(policy.endpoints), []
    directory = shared_directory(config)
    result = await directory.refresh([policy], only_stale=True)
    if result.failed:
        log.warning("policy %s: endpoint lookup: %s", policy.name, result.describe_failures(directory))
    for host, (old, new) in result.changed.items():
        log.info("policy %s: %s now resolves to %s (was %s)", policy.name, host, list(new), list(old))
    return directory.endpoints(policy), directory.unresolved(policy)
