"""Everything a gateway process holds while it runs, started and stopped with the app.

The parts that run are declared once, in `components`, in the order they start; they stop in
the reverse order (the recorder's shipper drains before the reward linker it wakes stops, the
judge stops first), and their `PeriodicWorker`s (gateway/workers.py) are what /readyz reports.
Authentication (gateway/auth/authenticator.py) and recording (gateway/recorder.py) are rooms of
their own, which this state holds and names for the handlers.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.discovery.directory import shared_directory
from apprentice.settings import Settings, resolve_secret
from apprentice.store.engine import make_async_engine
from apprentice.store.secrets import instance_secret
from gateway.auth.authenticator import Authenticator
from gateway.auth.keys import KeyCache, KeyInfo
from gateway.exploration.explorer import Explorer
from gateway.history_maintenance import HistoryMaintenance
from gateway.judging.worker import JudgeWorker
from gateway.limits.limiter import Limiter
from gateway.limits.prices import Prices
from gateway.limits.sync import LimitSync
from gateway.policies.notifications import AdapterNotifications
from gateway.policies.versions import PolicyVersions, sticky_graces
from gateway.recorder import Recorder
from gateway.rewards.linker import RewardLinker
from gateway.scoring.worker import RewardFunctionWorker
from gateway.tracing.exporter import make_tracer
from gateway.trajectories.cap import TrajectoryCap
from gateway.trajectories.stitching import StitchIndex
from gateway.upstreams.direct import make_session
from gateway.upstreams.discovery import EndpointDiscovery
from gateway.upstreams.routing import Router
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

TRAJECTORY_ID_SECRET = "trajectory_ids"


@dataclass(frozen=True)
class Component:
    """One part of the gateway that runs: how it starts (a coroutine or not), how it stops, and the
    workers /readyz checks."""

    name: str
    start: Callable[[], Awaitable[None] | None]
    stop: Callable[[], Awaitable[None]]
    workers: tuple[PeriodicWorker, ...] = ()


class GatewayState:
    def __init__(self, settings: Settings, database_url: str) -> None:
        self.settings = settings
        self.database_url = database_url
        # Policy endpoints given as DNS names: resolved at start, refreshed by a worker, read
        # from memory by the router (the admin API's promotion actions share the directory).
        self.endpoint_directory = shared_directory(settings.endpoint_discovery)
        self.router = Router(settings, self.endpoint_directory)
        self.endpoint_discovery = EndpointDiscovery(settings, self.endpoint_directory, self.router)
        self.engine: AsyncEngine = make_async_engine(database_url)
        self.keys = KeyCache(
            self.engine, admin_key=resolve_secret(settings.auth.admin_key), refresh_s=settings.auth.key_cache_ttl_s
        )
        self.authenticator = Authenticator(settings, self.keys)
        self.open_key: KeyInfo = self.authenticator.open_key
        self.stitch_index = StitchIndex(
            max_entries=settings.stitching.max_open_trajectories, ttl_s=settings.stitching.open_window_s
        )
        # Per-key and per-tenant limits, decided in memory, counts exchanged by limit_sync.
        self.limiter = Limiter(settings.limits, Prices(settings.model_list))
        self.limit_sync = LimitSync(self.engine, self.limiter, interval_s=settings.limits.sync_interval_s)
        self.trajectory_cap = TrajectoryCap(
            max_calls=settings.stitching.max_calls_per_trajectory,
            max_tokens=settings.stitching.max_tokens_per_trajectory,
            max_entries=settings.stitching.max_open_trajectories,
        )
        self.versions = PolicyVersions(
            self.engine,
            poll_interval_s=settings.adapter_poll_interval_s,
            sticky_grace_s=sticky_graces(settings.policies),
        )
        self.adapter_notifications = AdapterNotifications(database_url, self.versions.wake)
        # Extra unserved answers from each policy's lineage head, off the request path (docs/exploration.md).
        self.explorer = Explorer(settings, self.versions, self.record, lambda: self.http, lambda: self.instance_secret)
        self.session: aiohttp.ClientSession | None = None
        self.instance_secret = b""
        self.reward_linker = RewardLinker(self.engine, settings)
        # Only when some policy has a judge (docs/judge.md).
        self.judge = JudgeWorker(self.engine, settings)
        # Only when some policy declares reward functions (docs/reward-functions.md).
        self.reward_functions = RewardFunctionWorker(self.engine, settings)
        # Partitions of calls made ahead and dropped by retention (docs/history.md).
        self.history = HistoryMaintenance(self.engine, settings.history)
        # OpenTelemetry spans of calls and rewards (docs/tracing.md); None: not configured.
        self.tracer = make_tracer(settings)
        self.recorder = Recorder(settings, self.engine, on_shipped=self.reward_linker.wake, tracer=self.tracer)
        self.shipper = self.recorder.shipper  # /readyz and the operations endpoints read its backlog
        self.components: list[Component] = self._components()
        self.workers: list[PeriodicWorker] = [w for component in self.components for w in component.workers]

    def _components(self) -> list[Component]:
        """The parts that run, in the order they start (they stop in the reverse order)."""
        tracer = self.tracer
        discovery, judge = self.endpoint_discovery, self.judge
        return [
            *([Component("tracer", tracer.start, tracer.stop, (tracer.worker,))] if tracer is not None else []),
            Component("history-maintenance", self.history.start, self.history.stop, (self.history.worker,)),
            Component(
                "endpoint-discovery",
                discovery.start,
                discovery.stop,
                (discovery.worker,) if discovery.enabled else (),
            ),
            Component("keys", self.keys.start, self.keys.stop, (self.keys.worker,)),
            Component("limit-sync", self.limit_sync.start, self.limit_sync.stop, (self.limit_sync.worker,)),
            Component("policy-versions", self.versions.start, self.versions.stop, (self.versions.worker,)),
            Component(
                "adapter-notifications",
                self.adapter_notifications.start,
                self.adapter_notifications.stop,
                (self.adapter_notifications.worker,),
            ),
            Component("reward-linker", self.reward_linker.start, self.reward_linker.stop, (self.reward_linker.worker,)),
            Component("recorder", self.recorder.start, self.recorder.stop, tuple(self.recorder.workers)),
            Component("judge", judge.start, judge.stop, (judge.worker,) if judge.enabled else ()),
            Component(
                "reward-functions",
                self.reward_functions.start,
                self.reward_functions.stop,
                (self.reward_functions.worker,) if self.reward_functions.enabled else (),
            ),
            Component("explorer", self.explorer.start, self.explorer.stop),
        ]

    async def start(self) -> None:
        self.instance_secret = await instance_secret(self.engine, TRAJECTORY_ID_SECRET)
        self.session = make_session()
        for component in self.components:
            started = component.start()
            if inspect.isawaitable(started):
                await started

    async def stop(self) -> None:
        """Graceful: in-flight calls are done (the server waited); ship what is left."""
        for component in reversed(self.components):
            log.info("shutdown: %s", component.name)
            await component.stop()
        if self.session:
            await self.session.close()
        log.info("shutdown: closing the store's connections")
        await self.engine.dispose()

    # ---- recording (gateway/recorder.py) -------------------------------------------------
    def record(self, record: dict[str, Any], *, ship_now: bool = False) -> None:
        """Journal a completed call (see Recorder.record)."""
        self.recorder.record(record, ship_now=ship_now)

    def redact_early(self, call_id: object, trajectory_id: object, policy: str | None, *bodies: Any) -> None:
        """Start redacting a call's request bodies while the upstream works (see Recorder.redact_early)."""
        self.recorder.redact_early(call_id, trajectory_id, policy, *bodies)

    # ---- the upstream session and authentication ------------------------------------------
    @property
    def http(self) -> aiohttp.ClientSession:
        """The session for upstream calls; it exists from start() until stop()."""
        if self.session is None:
            raise RuntimeError("the gateway state is not started: no upstream HTTP session yet")
        return self.session

    async def authenticate(self, scope: Mapping[str, Any], *, admin: bool = False) -> KeyInfo:
        """The caller's key from an ASGI scope (gateway/auth/authenticator.py)."""
        return await self.authenticator.authenticate(scope, admin=admin)
