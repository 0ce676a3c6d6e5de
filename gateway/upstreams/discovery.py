"""The gateway's refresh of endpoints given as a DNS name: a `PeriodicWorker` every `refresh_s`.

Each step looks up every policy's DNS names (apprentice/discovery) and, when an address set
changed, rebuilds those policies' targets in the router; calls read the targets from memory
and never wait for DNS. The first lookup runs in `start`, before the gateway takes calls.

A failed or empty lookup keeps the last known addresses (the directory's rule); the step then
raises, so the worker's health on /readyz and `apprentice_worker_failures_total` name it, and
`apprentice_endpoint_lookup_failures_total{name}` counts it. Only a gateway with DNS entries
runs the worker.
"""

from __future__ import annotations

import logging

from apprentice.discovery.directory import EndpointDirectory, RefreshResult
from apprentice.settings import Settings
from gateway import metrics
from gateway.upstreams.routing import Router
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

WORKER_NAME = "endpoint-discovery"


class EndpointLookupFailed(Exception):
    """Some names could not be looked up this time; their last known addresses are kept."""


class EndpointDiscovery:
    """Keeps the router's policy targets in step with the DNS names' addresses."""

    def __init__(self, settings: Settings, directory: EndpointDirectory, router: Router) -> None:
        self.directory = directory
        self.router = router
        self.policies = router.dynamic_policies
        # A failed step does not back off: the next lookup comes after refresh_s as usual (one name
        # that never resolves must not slow down the refresh of the others).
        refresh_s = settings.endpoint_discovery.refresh_s
        self.worker = PeriodicWorker(WORKER_NAME, self.refresh, interval_s=refresh_s, max_backoff_s=refresh_s)

    @property
    def enabled(self) -> bool:
        return bool(self.policies)

    async def start(self) -> None:
        """Resolve once now (a failure is logged: calls to that policy get a 503 until its
        names resolve), then every `refresh_s`."""
        if not self.enabled:
            return
        await self.worker.run_once()
        self.worker.start()

    async def stop(self) -> None:
        if self.enabled:
            await self.worker.stop()

    async def refresh(self) -> RefreshResult:
        """One step: look up, rebuild changed targets, export the figures; raise on a failure."""
        result = await self.directory.refresh(self.policies)
        for host, (old, new) in result.changed.items():
            log.info("endpoint name %s now resolves to %s (was %s)", host, list(new), list(old))
        for name, endpoints in self.router.update_endpoints().items():
            log.info("policy %s: calls now go to %s", name, endpoints or "no endpoint")
        for policy in self.policies:
            metrics.POLICY_ENDPOINTS.labels(policy.name).set(len(self.router.endpoints_of(policy.name)))
        for host in result.failed:
            metrics.ENDPOINT_LOOKUP_FAILURES.labels(host).inc()
        if result.failed:
            raise EndpointLookupFailed(result.describe_failures(self.directory))
        return result
