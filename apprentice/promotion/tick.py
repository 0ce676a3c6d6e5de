"""The promotion job: one pass over every policy, run periodically.

`promotion_tick(engine, settings)` is the periodic job (the learner's scheduler calls it,
e.g. every 30 s; it is safe to run from several processes at once):

1. the lineage (`lineage`: the candidates newer than the promoted version, each trained from
   the one before): gates (run succeeded, loss finite, KL under the bound) as versions
   arrive; failures are rejected (actor "auto"). The canary follows the lineage: with
   `auto_canary` and no canary running, the newest passing version becomes the canary at the
   policy's `canary_share`; with a canary running, a newer passing version is loaded at every
   endpoint and takes the canary's place (the old canary goes back to candidate, superseded);
2. the canary: the lineage's rewards (every lineage version's trajectories since the
   lineage's first canary started) and the canary's own are compared with the promoted
   version's over the same periods (`canary`, `evaluation`, by default the always-valid
   sequential test) and the comparison stored in `adapter_versions.evaluation`; an
   `automatic` policy promotes the canary (the newest gated version) when the lineage is
   significantly better, rejects the whole lineage when it or the canary alone is
   significantly worse, or when `timeout_s` passes without a verdict; a `reviewed` policy
   waits for an admin (the lineage keeps training and the canary keeps following it);
3. the reconciler (`reconcile`): serving versions missing at an endpoint (restarted server)
   are loaded again; retired and rejected versions past the grace period are unloaded;
4. the adapter store (`promotion.adapter_store`, `adapter_store`): every serving version is
   published there for vLLM's filesystem LoRA resolver (again, if its copy went missing), and
   the copies of versions that stopped serving are removed after the same grace
   (`reconcile.sync_adapter_store`);
5. retention: files of old, never-promoted versions are deleted.

A paused policy (admin "pause") gets no automatic canary starts, moves or promotions; a
significantly worse lineage is still rejected.

Versions start serving through `serving`, as the admin's do; this module does not import the
admin actions (`actions`), so a test can run the job without them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import httpx
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.evalsets.gate import EvalGateRefused, EvalGateUnavailable
from apprentice.promotion import evaluation as ev
from apprentice.promotion import lifecycle, loading, serving
from apprentice.promotion.canary import evaluate_canary
from apprentice.promotion.clock import database_now
from apprentice.promotion.files import adapter_files_problem
from apprentice.promotion.gate_checks import check_gates
from apprentice.promotion.gates import FAIL, PASS
from apprentice.promotion.lifecycle import TransitionError
from apprentice.promotion.lineage import lineage_versions
from apprentice.promotion.reconcile import reconcile, sync_adapter_store
from apprentice.promotion.retention import apply_retention
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus
from apprentice.promotion.tick_report import TickReport
from apprentice.settings import PolicySettings, Settings

log = logging.getLogger(__name__)

AUTO = "auto"

__all__ = ["AUTO", "promotion_tick", "run_promotion_tick"]

CANDIDATE, CANARY, PROMOTED = VersionStatus.CANDIDATE, VersionStatus.CANARY, VersionStatus.PROMOTED


async def promotion_tick(
    engine: AsyncEngine,
    settings: Settings,
    *,
    client: httpx.AsyncClient | None = None,
    now: datetime | None = None,
    policies: list[str] | None = None,
    lineage_only: bool = False,
) -> TickReport:
    """One pass of the promotion job over every configured policy (or only `policies`).

    Call it periodically (the learner's scheduler does, every 30 s by default). Several
    processes may call it at once: each policy's steps 1-2 (the lineage: gates, the canary,
    the verdict) are handled by one of them at a time under one advisory lock, its steps 3-5
    (the endpoints, the adapter store, retention) under another, and every transition is a
    locked, idempotent transaction anyway. Returns what it did (`TickReport.actions`) and what
    failed (`TickReport.errors`); it raises only for programming errors.

    `lineage_only`: steps 1-2 alone (the learner's lineage pass, every few seconds: a new
    candidate becomes the canary and a lineage whose evidence has become enough is promoted
    seconds later, the sequential test holding at every look). Two locks, because steps 3-5
    can take tens of seconds: a busy local inference server answers each unload only after its
    running batch drains, and a live loop's lineage pass waited 42 s behind them, past the unit
    that decided its verdict.

    `now` is a time on the database's clock (the default: `database_now`), the clock that
    wrote every timestamp the job compares with; a test that wants to be past a grace period
    passes `database_now(engine) + grace`.
    """
    quiet = frozenset({"skipped", "evaluating", "awaiting_review"}) if lineage_only else frozenset()
    report = TickReport(quiet=quiet)
    own = client is None
    client = client or httpx.AsyncClient(timeout=120.0)
    try:
        for policy in settings.policies:
            if policies is not None and policy.name not in policies:
                continue
            try:
                when = now or await database_now(engine)
                await _tick_policy_once(engine, settings, policy, report, client, when, lineage_only)
            except Exception as exc:  # one policy's trouble must not stop the others
                log.exception("promotion tick failed for policy %s", policy.name)
                report.errors.append(f"{policy.name}: {type(exc).__name__}: {exc}")
    finally:
        if own:
            await client.aclose()
    return report


async def _tick_policy_once(
    engine: AsyncEngine,
    settings: Settings,
    policy: PolicySettings,
    report: TickReport,
    client: httpx.AsyncClient,
    now: datetime,
    lineage_only: bool = False,
) -> None:
    """`_PolicyPass`'s two parts, each under its own advisory lock for the policy; a part is
    skipped while another process holds its lock (that process is doing it)."""
    async with engine.connect() as connection:
        paused = await lifecycle.learning_paused(connection, policy.name)
    policy_pass = _PolicyPass(engine, settings, policy, report, client, now, paused)
    # The learner's lineage pass holds the first lock every few seconds: a full pass that finds
    # it held leaves those steps to it without a line in the log.
    lineage_key = f"apprentice.promotion.{policy.name}"
    await _under_lock(engine, lineage_key, policy.name, report, policy_pass.lineage, quiet_skip=True)
    if not lineage_only:
        key = f"apprentice.promotion.endpoints.{policy.name}"
        await _under_lock(engine, key, policy.name, report, policy_pass.endpoints)


async def _under_lock(
    engine: AsyncEngine,
    key: str,
    policy: str,
    report: TickReport,
    step: Callable[[], Awaitable[None]],
    *,
    quiet_skip: bool = False,
) -> None:
    """Run `step` while holding the session advisory lock `key`; skip it while someone else does."""
    async with engine.connect() as lock_connection:
        got = (await lock_connection.execute(text("SELECT pg_try_advisory_lock(hashtext(:k))"), {"k": key})).scalar()
        await lock_connection.commit()
        if not got:
            report.add(policy, None, "skipped", f"another process holds {key}", quiet=quiet_skip)
            return
        try:
            await step()
        finally:
            try:
                await lock_connection.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})
                await lock_connection.commit()
            except DBAPIError as exc:  # the connection died (a restart): its session lock died with it
                if not exc.connection_invalidated:
                    raise


def run_promotion_tick(
    settings: Settings, database_url: str, *, policies: list[str] | None = None, lineage_only: bool = False
) -> TickReport:
    """`promotion_tick` for synchronous callers (the learner's scheduler threads): its own
    event loop and a small engine, disposed afterwards."""
    from apprentice.store.engine import make_async_engine

    async def once() -> TickReport:
        engine = make_async_engine(database_url, pool_size=2, max_overflow=2)
        try:
            return await promotion_tick(engine, settings, policies=policies, lineage_only=lineage_only)
        finally:
            await engine.dispose()

    return asyncio.run(once())


@dataclass
class _PolicyPass:
    """One policy's share of a tick: what it works with, and its steps in order."""

    engine: AsyncEngine
    settings: Settings
    policy: PolicySettings
    report: TickReport
    client: httpx.AsyncClient
    now: datetime
    paused: bool  # an admin paused the policy: no automatic canary starts or promotions

    async def run(self) -> None:
        await self.lineage()
        await self.endpoints()

    async def lineage(self) -> None:
        """Steps 1-2: the lineage's gates and canary, and the canary's verdict."""
        await self.gate_lineage()
        await self.judge_canary()

    async def endpoints(self) -> None:
        """Steps 3-5: the endpoints and the adapter store hold what serves; retention."""
        await reconcile(
            self.engine,
            self.policy,
            report=self.report,
            client=self.client,
            now=self.now,
            discovery=self.settings.endpoint_discovery,
        )
        await sync_adapter_store(self.engine, self.policy, report=self.report, now=self.now)
        await self.apply_retention()

    # 1. gates on the lineage as it grows, and the canary follows its newest passing version
    async def gate_lineage(self) -> None:
        async with self.engine.connect() as connection:
            versions = await lifecycle.versions_of(connection, self.policy.name, (CANDIDATE, CANARY, PROMOTED))
        canary = next((v for v in versions if v.status == CANARY), None)
        passing = []
        for version in lineage_versions(versions):
            if version.status != CANDIDATE:
                continue
            if version.gates.get("outcome") == PASS:  # a finished run's gates do not change: not checked again
                passing.append(version)
                continue
            gates = await check_gates(self.engine, self.settings, version, files=True)
            if gates.outcome == FAIL:
                await self._reject(version, CANDIDATE, "gates failed: " + "; ".join(gates.failures()))
            elif gates.outcome == PASS:
                passing.append(version)
        if not passing or self.paused:
            return
        newest = passing[-1]
        if canary is None and self.policy.promotion.auto_canary:
            await self._put_in_canary(newest, replacing=None)
        elif canary is not None and newest.version > canary.version:
            await self._put_in_canary(newest, replacing=canary)

    async def _put_in_canary(self, newest: AdapterVersion, *, replacing: AdapterVersion | None) -> None:
        """Load `newest` on every endpoint and make it the canary: a first canary, or the
        successor of `replacing` along the lineage (which goes back to candidate)."""
        # Its files may have gone (or been cut short) since its gates passed: checked again right
        # before any endpoint is asked to load it, so the reason names the file, not an endpoint's 404.
        if (problem := await asyncio.to_thread(adapter_files_problem, newest.path)) is not None:
            await check_gates(self.engine, self.settings, newest, files=True)
            await self._reject(newest, CANDIDATE, f"gates failed: adapter_files: {problem}")
            return
        try:
            if replacing is None:
                share = self.policy.promotion.canary_share
                reason = f"gates passed; canary at {share:.0%} of new trajectories"
                result = await serving.start_canary(
                    self.engine, self.settings, newest, actor=AUTO, client=self.client, reason=reason, files=True
                )
            else:
                reason = f"gates passed; the canary follows its lineage from {replacing.name}"
                result = await serving.supersede_canary(
                    self.engine, self.settings, newest, actor=AUTO, client=self.client, reason=reason
                )
        except loading.LoadError as exc:
            await self._load_failed(newest, exc)
            return
        except EvalGateRefused as exc:  # worse on the evaluation set: it never serves
            await self._reject(newest, CANDIDATE, str(exc))
            return
        except EvalGateUnavailable as exc:  # not scored (set, endpoint, scorer): the next tick tries again
            self.report.errors.append(f"{self.policy.name}: {exc}")
            return
        except TransitionError as exc:  # an admin acted meanwhile
            self.report.add(self.policy.name, newest.name, "unchanged", str(exc))
            return
        except DBAPIError as exc:
            self._not_committed(newest, "canary", exc)
            return
        loads = ", ".join(f"{e.endpoint} {e.action}" for e in result.endpoints)
        self.report.add(
            self.policy.name,
            newest.name,
            "canary" if result.transition.changed else "unchanged",
            loads if replacing is None else f"superseded {replacing.name}; {loads}",
        )

    async def _load_failed(self, version: AdapterVersion, exc: loading.LoadError) -> None:
        self.report.errors.append(f"{self.policy.name}: {exc}")
        if exc.permanent:  # no adapter at the path, wrong base, rank too high: retrying won't help
            await self._reject(version, CANDIDATE, f"could not be loaded: {exc}")
        else:
            self.report.add(self.policy.name, version.name, "load_failed", str(exc))

    # 2. the lineage's evaluation and the automatic verdict
    async def judge_canary(self) -> None:
        canaries = await self._versions(CANARY)
        if not canaries:
            return
        canary = canaries[0]
        evaluation = await evaluate_canary(self.engine, self.settings, canary, self.now)
        await lifecycle.update_jsonb(self.engine, canary.id, "evaluation", evaluation.document)
        summary = evaluation.summary
        teacher = evaluation.document.get("takeover")
        if teacher is not None and evaluation.decision in (ev.PROMOTE, ev.REJECT, ev.TIMEOUT):
            if evaluation.decision == ev.PROMOTE and not self.paused:
                await self._promote(canary, teacher["reason"], summary)
            elif evaluation.decision != ev.PROMOTE:
                await self._reject_lineage(teacher["reason"])
            return
        if evaluation.decision == ev.PROMOTE and not self.paused:
            await self._promote(canary, f"lineage significantly better: {summary}", summary)
        elif evaluation.decision == ev.REJECT and evaluation.document["verdict"] == ev.WORSE:
            await self._reject_lineage(f"lineage significantly worse: {summary}")
        elif evaluation.decision == ev.REJECT:  # the lineage is not, the newest version alone is worse
            newest = evaluation.document["newest"]["interval"]
            await self._reject_lineage(
                f"newest version {canary.name} significantly worse: mean difference "
                f"{newest['difference']:+.4f}, interval [{newest['low']:+.4f}, "
                f"{newest['high']:+.4f}]"
            )
        elif evaluation.decision == ev.TIMEOUT:
            timeout = self.policy.promotion.timeout_s
            await self._reject_lineage(f"no significant difference within {timeout:g}s: {summary}")
        else:
            waiting = "evaluating" if evaluation.decision == ev.WAIT else "awaiting_review"
            self.report.add(self.policy.name, canary.name, waiting, summary)

    async def _reject_lineage(self, reason: str) -> None:
        for version in await lifecycle.reject_lineage(self.engine, self.policy.name, actor=AUTO, reason=reason):
            self.report.add(self.policy.name, version.name, "rejected", reason)

    async def _promote(self, canary: AdapterVersion, reason: str, summary: str) -> None:
        try:
            result = await serving.promote(
                self.engine,
                self.settings,
                canary,
                actor=AUTO,
                client=self.client,
                from_statuses=(CANARY,),
                reason=reason,
            )
        except (loading.LoadError, TransitionError) as exc:
            self.report.errors.append(f"{self.policy.name}: {exc}")
            return
        except DBAPIError as exc:
            self._not_committed(canary, "promoted", exc)
            return
        self.report.add(
            self.policy.name, canary.name, "promoted" if result.transition.changed else "unchanged", summary
        )

    # 4. retention
    async def apply_retention(self) -> None:
        promotion = self.policy.promotion
        for item in await apply_retention(
            self.engine, self.policy.name, keep_last=promotion.keep_last, grace_s=promotion.unload_grace_s, now=self.now
        ):
            self.report.add(self.policy.name, item.name, "files_" + item.result.split(":")[0], item.path)

    # bookkeeping
    def _not_committed(self, version: AdapterVersion, to_status: str, exc: DBAPIError) -> None:
        """A transition the database did not commit (it restarted, the connection broke): the
        version keeps its status, and the report says which transition failed and why."""
        cause = str(exc.orig or exc).strip().splitlines()[0]
        self.report.errors.append(
            f"{self.policy.name}: {version.name} -> {to_status} not committed (database: {cause}); "
            f"{version.name} stays {version.status}, the next tick retries"
        )
        log.error("promotion: %s", self.report.errors[-1])

    async def _versions(self, status: VersionStatus) -> list[AdapterVersion]:
        async with self.engine.connect() as connection:
            return await lifecycle.versions_of(connection, self.policy.name, (status,))

    async def _reject(self, version: AdapterVersion, from_status: VersionStatus, reason: str) -> None:
        """An automatic rejection; someone else moving the version first is reported, not raised."""
        try:
            result = await lifecycle.reject(
                self.engine, version.id, actor=AUTO, from_statuses=(from_status,), reason=reason
            )
        except TransitionError as exc:
            self.report.add(self.policy.name, version.name, "unchanged", str(exc))
            return
        self.report.add(
            self.policy.name, version.name, "rejected" if result.changed else "unchanged", result.version.status.value
        )
