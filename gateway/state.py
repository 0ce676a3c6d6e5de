"""Everything a gateway process holds while it runs, started and stopped with the app.

The background jobs are `PeriodicWorker`s (gateway/workers.py), listed in `workers` for
/readyz and stopped in order at shutdown: the journal shipper drains before the reward
linker and the stitcher, which it wakes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.discovery.directory import shared_directory
from apprentice.settings import Settings, resolve_secret
from apprentice.store.engine import make_async_engine
from apprentice.store.secrets import instance_secret
from gateway import metrics
from gateway.auth.keys import KeyCache, KeyInfo
from gateway.history_maintenance import HistoryMaintenance
from gateway.http.asgi import header
from gateway.http.errors import GatewayError
from gateway.journal.rejected import set_aside
from gateway.journal.shipper import JournalShipper
from gateway.journal.writer import JournalWriter
from gateway.judging.worker import JudgeWorker
from gateway.limits.limiter import Limiter
from gateway.limits.prices import Prices
from gateway.limits.sync import LimitSync
from gateway.policies.notifications import AdapterNotifications
from gateway.policies.versions import PolicyVersions, sticky_graces
from gateway.redaction.record import RecordRedactor
from gateway.rewards.linker import RewardLinker
from gateway.store.calls import insert_call_lines, stitch_pending
from gateway.tracing.exporter import make_tracer
from gateway.trajectories.cap import TrajectoryCap
from gateway.trajectories.stitching import StitchIndex
from gateway.upstreams.direct import make_session
from gateway.upstreams.discovery import EndpointDiscovery
from gateway.upstreams.routing import Router
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

TRAJECTORY_ID_SECRET = "trajectory_ids"
# The placeholders' HMAC key when redaction.key is not configured (docs/privacy.md).
REDACTION_SECRET = "redaction"
PENDING_MARK = b'"stitch_pending":true'
STITCH_INTERVAL_S = 0.5
# Pending calls older than the open window are settled even when no new one arrives.
SETTLE_INTERVAL_S = 30.0


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
        self.journal = JournalWriter(
            settings.journal_dir,
            max_bytes=settings.journal.segment_max_bytes,
            max_age_s=settings.journal.segment_max_age_s,
            fsync=settings.journal.fsync,
        )
        self.shipper = JournalShipper(
            self.journal,
            self._ship,
            batch_rows=settings.journal.ship_batch_rows,
            interval_s=settings.journal.ship_interval_s,
        )
        self.keys = KeyCache(
            self.engine, admin_key=resolve_secret(settings.auth.admin_key), refresh_s=settings.auth.key_cache_ttl_s
        )
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
        self.open_key = KeyInfo(id=None, name="open", tenant=settings.auth.open_tenant, role="admin")
        self.versions = PolicyVersions(
            self.engine,
            poll_interval_s=settings.adapter_poll_interval_s,
            sticky_grace_s=sticky_graces(settings.policies),
        )
        self.adapter_notifications = AdapterNotifications(database_url, self.versions.wake)
        self.session: aiohttp.ClientSession | None = None
        self.instance_secret = b""
        # Redacts every record before it is journaled (gateway/redaction); None: nothing to redact.
        self.redactor: RecordRedactor | None = None
        # Woken when a shipped batch holds calls waiting for their parent; the wake delay lets
        # the other processes' parents land first.
        self.stitcher = PeriodicWorker(
            "trajectory-stitcher", self._stitch_pass, interval_s=SETTLE_INTERVAL_S, wake_delay_s=STITCH_INTERVAL_S
        )
        self.reward_linker = RewardLinker(self.engine, settings)
        # Only when some policy has a judge (docs/judge.md).
        self.judge = JudgeWorker(self.engine, settings)
        # Partitions of calls made ahead and dropped by retention (docs/history.md).
        self.history = HistoryMaintenance(self.engine, settings.history)
        self.workers: list[PeriodicWorker] = [
            self.keys.worker,
            self.limit_sync.worker,
            self.versions.worker,
            self.adapter_notifications.worker,
            self.shipper.worker,
            self.stitcher,
            self.reward_linker.worker,
            self.history.worker,
        ]
        if self.judge.enabled:
            self.workers.append(self.judge.worker)
        if self.endpoint_discovery.enabled:
            self.workers.append(self.endpoint_discovery.worker)
        # OpenTelemetry spans of calls and rewards (docs/tracing.md); None: not configured.
        self.tracer = make_tracer(settings)
        if self.tracer is not None:
            self.workers.append(self.tracer.worker)

    async def start(self) -> None:
        self.instance_secret = await instance_secret(self.engine, TRAJECTORY_ID_SECRET)
        self.redactor = await self._redactor()
        self.journal.open()
        self.session = make_session()
        await self.endpoint_discovery.start()
        await self.keys.start()
        await self.limit_sync.start()
        await self.versions.start()
        self.adapter_notifications.start()
        self.shipper.start()
        self.stitcher.start()
        self.reward_linker.start()
        self.history.start()
        self.judge.start()
        if self.tracer is not None:
            self.tracer.start()

    async def stop(self) -> None:
        """Graceful: in-flight calls are done (the server waited); ship what is left."""
        for step in (
            self.judge.stop,
            self.adapter_notifications.stop,
            self.keys.stop,
            self.limit_sync.stop,
            self.versions.stop,
            self.shipper.stop,
            self.reward_linker.stop,
            self.stitcher.stop,
            self.endpoint_discovery.stop,
            self.history.stop,
            *([self.tracer.stop] if self.tracer is not None else []),
        ):
            log.info("shutdown: %s", step.__qualname__)
            await step()
        self.journal.close()
        if self.session:
            await self.session.close()
        log.info("shutdown: closing the store's connections")
        await self.engine.dispose()

    # ---- recording ---------------------------------------------------------------------
    def record(self, record: dict[str, Any]) -> None:
        """Journal a completed call (synchronous: done before the call's last byte is sent),
        redacted first: neither the journal nor the store ever holds what redaction replaces."""
        if self.redactor is not None:
            record = self.redactor.apply(record)
        self.journal.append(record)
        metrics.JOURNALED.inc()
        self.shipper.note_record()
        if self.tracer is not None:
            self.tracer.offer(record)

    def redact_early(self, call_id: object, trajectory_id: object, policy: str | None, *bodies: Any) -> None:
        """Start redacting a call's request bodies while the upstream works (its record, made
        later from the same objects, takes the result: see gateway/redaction/record.py)."""
        if self.redactor is not None:
            self.redactor.early(str(call_id), str(trajectory_id), policy, *bodies)

    async def _redactor(self) -> RecordRedactor | None:
        settings = self.settings
        redacts = settings.redaction.enabled or any(
            policy.redaction is not None and policy.redaction.enabled for policy in settings.policies
        )
        if not redacts:
            return None
        key = resolve_secret(settings.redaction.key)
        secret = key.encode() if key else await instance_secret(self.engine, REDACTION_SECRET)
        redactor = RecordRedactor(settings, secret)
        return redactor if redactor.active else None

    async def _ship(self, lines: list[bytes]) -> int:
        try:
            shipped = await insert_call_lines(self.engine, lines)
        except Exception:
            metrics.SHIP_FAILURES.inc()
            raise
        for rejected in shipped.rejected:
            set_aside(self.settings.journal_dir, rejected.line, rejected.reason)
            metrics.SHIP_REJECTED.inc()
        count = shipped.stored
        metrics.SHIPPED.inc(count)
        self.reward_linker.wake()  # no query here: the linker probes for pending rewards itself
        metrics.JOURNAL_BACKLOG.set(self.shipper.stats.backlog_bytes)
        if any(PENDING_MARK in line for line in lines):
            self.stitcher.wake()
        return count

    async def _stitch_pass(self) -> None:
        merged = await stitch_pending(self.engine, self.settings.stitching.open_window_s)
        if merged:
            log.debug("stitched %d trajectories split across processes", merged)
            self.stitcher.wake()  # a later parent may have become known too

    # ---- authentication ----------------------------------------------------------------
    @property
    def http(self) -> aiohttp.ClientSession:
        """The session for upstream calls; it exists from start() until stop()."""
        if self.session is None:
            raise RuntimeError("the gateway state is not started: no upstream HTTP session yet")
        return self.session

    async def authenticate(self, scope: Mapping[str, Any], *, admin: bool = False) -> KeyInfo:
        """The caller's key from an ASGI scope (a plain one or a framework request's `scope`)."""
        if self.settings.auth.mode == "open":  # local use only: the serve command enforces loopback
            return self.open_key
        authorization = header(scope, b"authorization")
        if not authorization or not authorization.lower().startswith("bearer "):
            raise GatewayError(
                401,
                "You didn't provide an API key. Pass it in the Authorization header (Authorization: Bearer YOUR_KEY).",
                code="missing_api_key",
            )
        key = authorization[7:].strip()
        try:
            info = await self.keys.authenticate(key)
        except Exception as exc:
            raise GatewayError(
                503,
                "the API key could not be checked: the store is unreachable (known keys keep working); retry shortly",
                code="key_store_unavailable",
            ) from exc
        if info is None:
            shown = key[:7] + "..." if len(key) > 10 else "***"
            raise GatewayError(401, f"Incorrect API key provided: {shown}", code="invalid_api_key")
        if admin and not info.is_admin:
            raise GatewayError(403, "this endpoint needs the admin key", code="admin_key_required")
        return info
