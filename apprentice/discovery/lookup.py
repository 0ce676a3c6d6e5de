"""One DNS lookup: the A and AAAA addresses of a name, through dnspython's asyncio resolver.

dnspython reads /etc/resolv.conf (nameservers, `search`, `ndots`), as the C library would: a
relative name such as `vllm-headless.inference.svc` in a Kubernetes pod is tried with the
pod's search domains first. `nameservers` (the setting `endpoint_discovery.nameservers`)
replaces resolv.conf's servers, for an operator who wants a particular one and for tests that
run their own DNS server on a loopback port.

dnspython is imported on the first lookup, not with this module: its asyncio resolver pulls in
its DNS-over-HTTPS client, about 0.3 s of every gateway and learner start on a 2-core machine
(sampled with py-spy), and most deployments name no endpoint by DNS.

No answer and NXDOMAIN mean "no address" (a headless service with no ready pod); a timeout,
SERVFAIL or an unreachable server is a failure (`LookupFailed`). The caller decides what
either does to the endpoints it knows (`directory`: neither drops them).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from apprentice.discovery.entries import parse_nameserver

if TYPE_CHECKING:
    import dns.asyncresolver

RECORD_TYPES = ("A", "AAAA")


class LookupFailed(Exception):
    """The name could not be looked up (timeout, SERVFAIL, no nameserver answered)."""


class Lookup:
    """Resolves names to sorted address tuples; holds only configuration, no cache."""

    def __init__(self, nameservers: list[str] | None = None, timeout_s: float = 2.0) -> None:
        self.nameservers = list(nameservers or [])
        self.timeout_s = timeout_s

    def _resolver(self) -> dns.asyncresolver.Resolver:
        """A resolver configured now: resolv.conf is read afresh, so an edited file takes effect."""
        import dns.asyncresolver
        import dns.nameserver
        import dns.resolver

        if not self.nameservers:
            try:
                resolver = dns.asyncresolver.Resolver(configure=True)
            except dns.resolver.NoResolverConfiguration as exc:
                raise LookupFailed(
                    f"no nameserver in /etc/resolv.conf ({exc}); set endpoint_discovery.nameservers"
                ) from exc
        else:
            resolver = dns.asyncresolver.Resolver(configure=False)
            resolver.nameservers = [
                dns.nameserver.Do53Nameserver(address, port)
                for address, port in map(parse_nameserver, self.nameservers)
            ]
        resolver.lifetime = self.timeout_s
        resolver.timeout = self.timeout_s
        resolver.cache = None
        return resolver

    async def addresses(self, host: str) -> tuple[str, ...]:
        """The name's IPv4 and IPv6 addresses, sorted; () when it has none. Raises LookupFailed."""
        resolver = self._resolver()
        found: set[str] = set()
        answers = await asyncio.gather(
            *(self._records(resolver, host, kind) for kind in RECORD_TYPES), return_exceptions=True
        )
        for records in answers:  # the first failure in RECORD_TYPES order, whichever came first
            if isinstance(records, BaseException):
                raise records
            found.update(records)
        return tuple(sorted(found))

    async def _records(self, resolver: dns.asyncresolver.Resolver, host: str, kind: str) -> list[str]:
        import dns.exception
        import dns.resolver

        try:
            answer = await resolver.resolve(host, kind, search=True, lifetime=self.timeout_s)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.Timeout as exc:
            raise LookupFailed(f"{kind}: no answer within {self.timeout_s:g}s") from exc
        except dns.resolver.NoNameservers as exc:  # its text lists every server's answer at length
            raise LookupFailed(f"{kind}: SERVFAIL or no answer from {len(resolver.nameservers)} nameserver(s)") from exc
        except dns.exception.DNSException as exc:
            raise LookupFailed(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}") from exc
        return [record.to_text() for record in answer]
