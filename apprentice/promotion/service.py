"""Promotion as the admin API and the learner's scheduler use it.

Every action that makes a version serve (canary start, promotion, rollback) first loads the
adapter into every inference endpoint of the policy (`loading.ensure_loaded`: idempotent,
retried, verified with GET /models) and only then commits the status change
(`lifecycle`), so a gateway never routes a call to a name an endpoint does not serve. A
version that stops serving (retired, rejected) stays loaded for `unload_grace_s`, so calls
in flight and gateways that have not polled yet keep working; the reconciler unloads it
afterwards.

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
   version's over the same periods (`evaluation`, by default the always-valid sequential
   test) and the comparison stored in `adapter_versions.evaluation`; an `automatic` policy
   promotes the canary (the newest gated version) when the lineage is significantly better,
   rejects the whole lineage when it or the canary alone is significantly worse, or when
   `timeout_s` passes without a verdict; a `reviewed` policy waits for an admin (the lineage
   keeps training and the canary keeps following it);
3. the reconciler: serving versions missing at an endpoint (restarted server) are loaded
   again; retired and rejected versions past the grace period are unloaded;
4. the adapter store (`promotion.adapter_store`, `adapter_store`): every serving version is
   published there for vLLM's filesystem LoRA resolver (again, if its copy went missing), and
   the copies of versions that stopped serving are removed after the same grace;
5. retention: files of old, never-promoted versions are deleted.

With an adapter store, every action that makes a version serve publishes it there before any
endpoint loads it, so a replica the promotion job never called (started later, or not in
`endpoints`) finds it on first request. A process that cannot see the version's files (a
gateway without the adapters volume, acting for an admin) leaves publishing to the promotion
job's next tick.

A paused policy (admin "pause") gets no automatic canary starts, moves or promotions; a
significantly worse lineage is still rejected.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.discovery.directory import current_endpoints
from apprentice.evalsets.gate import EvalGateRefused, EvalGateUnavailable, require_eval_gate
from apprentice.promotion import evaluation as ev
from apprentice.promotion import lifecycle, loading, takeover
from apprentice.promotion.adapter_store import AdapterStore, PublishError
from apprentice.promotion.files import adapter_files_problem
from apprentice.promotion.gates import FAIL, PASS, GateReport, evaluate_gates, json_number, with_files_check
from apprentice.promotion.lifecycle import TransitionError, TransitionResult, VersionNotFound
from apprentice.promotion.lineage import lineage_head, lineage_versions, promoted_version
from apprentice.promotion.object_store import ObjectStore
from apprentice.promotion.provenance import Provenance, provenance
from apprentice.promotion.retention import apply_retention
from apprentice.promotion.rows import AdapterVersion, PolicyState, TrainingRun, Transition
from apprentice.promotion.status import SERVING, VersionStatus
from apprentice.settings import EndpointDiscoverySettings, PolicySettings, Settings, resolve_secret
from apprentice.store.tables import training_runs

log = logging.getLogger(__name__)

AUTO = "auto"

__all__ = [
    "AUTO",
    "ActionResult",
    "CanaryEvaluation",
    "PolicyNotConfigured",
    "PolicySummary",
    "TickReport",
    "TransitionError",
    "VersionDetail",
    "VersionListing",
    "VersionNotFound",
    "approve",
    "check_gates",
    "database_now",
    "evaluate_canary",
    "list_policies",
    "list_versions",
    "promote_now",
    "promotion_tick",
    "reconcile",
    "reject",
    "rollback",
    "sync_adapter_store",
    "run_promotion_tick",
    "set_paused",
    "version_detail",
    "version_listing",
]

CANDIDATE, CANARY, PROMOTED = VersionStatus.CANDIDATE, VersionStatus.CANARY, VersionStatus.PROMOTED
RETIRED, REJECTED = VersionStatus.RETIRED, VersionStatus.REJECTED


class PolicyNotConfigured(LookupError):
    def __init__(self, policy: str) -> None:
        super().__init__(f"policy {policy!r} is not configured (policies: in the config file)")


@dataclass
class ActionResult:
    transition: TransitionResult
    endpoints: list[loading.EndpointOutcome] = field(default_factory=list)
    gates: GateReport | None = None


@dataclass
class TickReport:
    actions: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, policy: str, version: str | None, action: str, detail: str = "") -> None:
        self.actions.append({"policy": policy, "version": version, "action": action, "detail": detail})
        log.info("promotion: %s %s %s %s", policy, version or "-", action, detail)


def _now() -> datetime:
    return datetime.now(timezone.utc)


async def database_now(engine: AsyncEngine) -> datetime:
    """The database server's clock (`clock_timestamp()`, not the transaction's start).

    Why: every time the promotion job compares with -- a transition's `created_at`, a canary's
    start, the unload grace, retention -- was written by the database's `now()`. Comparing them
    with this process's clock mixes two clocks: a learner host whose clock lags the database's
    by more than the grace never unloads a version that stopped serving (and one that runs ahead
    unloads it early). One clock, the database's, makes the grace mean what it says."""
    async with engine.connect() as connection:
        now: datetime = (await connection.execute(text("SELECT clock_timestamp()"))).scalar_one()
    return now


def policy_settings(settings: Settings, name: str) -> PolicySettings:
    policy = settings.policy(name)
    if policy is None:
        raise PolicyNotConfigured(name)
    return policy


async def _load(
    settings: Settings, policy: PolicySettings, version: AdapterVersion, client: httpx.AsyncClient | None
) -> list[loading.EndpointOutcome]:
    if (deleted := lifecycle.files_deleted(version)) is not None:
        raise deleted
    endpoints, unresolved = await current_endpoints(settings.endpoint_discovery, policy)
    if not endpoints and unresolved:  # not the adapter's fault: the next tick retries, nothing is rejected
        raise loading.LoadError(version.name, dict.fromkeys(unresolved, "the DNS name has not resolved to any address"))
    await _publish(policy, version)
    return await loading.ensure_loaded(
        endpoints, version.name, version.path, api_key=resolve_secret(policy.api_key), client=client
    )


async def _publish(policy: PolicySettings, version: AdapterVersion) -> None:
    """Publish `version` to the policy's adapter store, if it has one, before it serves.

    A process that does not see the version's files (a gateway acting for an admin, without the
    adapters volume, whether or not it mounts the store) skips: the promotion job publishes every serving
    version missing from the store at its next tick (`sync_adapter_store`). Files that are
    there but not whole raise PublishError: nothing corrupt is published or served."""
    store = AdapterStore.for_policy(policy)
    if store is None:
        return
    if not await asyncio.to_thread(Path(version.path).exists):
        log.info("promotion: %s not published from this process (no view of its files); left to the tick", version.name)
        return
    try:
        await asyncio.to_thread(store.publish, version.name, version.path, version.id)
    except ValueError as exc:  # a version name the store cannot hold as a directory (AdapterStore.location)
        raise PublishError(version.name, store.root, str(exc), permanent=True) from exc
    if (objects := ObjectStore.for_policy(policy)) is not None:
        await asyncio.to_thread(objects.upload, version.name, store.location(version.name))


def _precheck(
    version: AdapterVersion, to_status: VersionStatus, from_statuses: tuple[VersionStatus, ...] | None = None
) -> bool:
    """True when there is something to do; TransitionError when it is not allowed (before loading)."""
    if version.status == to_status:
        return False
    allowed = lifecycle.ALLOWED[to_status] & frozenset(from_statuses or lifecycle.ALLOWED[to_status])
    if version.status not in allowed:
        raise lifecycle.refusal(version, to_status, allowed)
    return True


def _unchanged(version: AdapterVersion) -> ActionResult:
    return ActionResult(TransitionResult(version, changed=False, from_status=version.status))


# ---------------------------------------------------------------- gates


async def training_run_of(engine: AsyncEngine, version: AdapterVersion) -> TrainingRun | None:
    query = select(training_runs)
    if version.training_run_id is not None:
        query = query.where(training_runs.c.id == version.training_run_id)
    else:  # the learner may only have filled training_runs.produced_version_id
        query = query.where(training_runs.c.produced_version_id == version.id)
    async with engine.connect() as connection:
        row = (await connection.execute(query.order_by(training_runs.c.started_at.desc()).limit(1))).first()
    return TrainingRun.from_row(row) if row is not None else None


async def check_gates(
    engine: AsyncEngine, settings: Settings, version: AdapterVersion, *, files: bool = False
) -> GateReport:
    """Evaluate the gates of a version's training run and store them in `adapter_versions.gates`.

    `files`: check the adapter's files too (`files.adapter_files_problem`); only the promotion
    job asks, since it runs where the adapters are written (a gateway may not see them)."""
    policy = policy_settings(settings, version.policy)
    report = evaluate_gates(await training_run_of(engine, version), policy.promotion.kl_bound)
    if files:
        report = with_files_check(report, await asyncio.to_thread(adapter_files_problem, version.path))
    document = {**report.as_json(), "kl_bound": policy.promotion.kl_bound, "checked_at": _now().isoformat()}
    if version.gates.get("outcome") != report.outcome or report.outcome != "wait":
        await lifecycle.update_jsonb(engine, version.id, "gates", document)
    return report


async def _require_gates(
    engine: AsyncEngine,
    settings: Settings,
    version: AdapterVersion,
    *,
    force: bool,
    hint: str = "",
    files: bool = False,
) -> GateReport:
    gates = await check_gates(engine, settings, version, files=files)
    if not gates.passed and not force:
        detail = "; ".join(gates.failures()) or "the training run has not finished"
        raise TransitionError(
            f"adapter version {version.name} does not pass the gates: {detail}{hint}", current=version.status
        )
    return gates


# ---------------------------------------------------------------- admin actions


async def _start_canary(
    engine: AsyncEngine,
    settings: Settings,
    version: AdapterVersion,
    *,
    actor: str,
    reason: str | None,
    client: httpx.AsyncClient | None,
    force: bool = False,
    files: bool = False,
) -> ActionResult:
    if not _precheck(version, CANARY):
        return _unchanged(version)
    policy = policy_settings(settings, version.policy)
    gates = await _require_gates(engine, settings, version, force=force, files=files)
    async with engine.connect() as connection:
        serving = await lifecycle.serving_versions(connection, version.policy)
    if serving.canary is not None:
        raise TransitionError(
            f"policy {version.policy!r} already has a canary ({serving.canary.name}): promote or reject it first",
            current=version.status,
        )
    if not force:  # the version about to serve, scored on the evaluation set against the promoted one
        await require_eval_gate(engine, settings, policy, version, client=client)
    incumbent = serving.promoted
    evaluation = {
        "incumbent_version_id": str(incumbent.id) if incumbent else None,
        "incumbent_name": incumbent.name if incumbent else None,
        "verdict": ev.INSUFFICIENT,
    }

    async def load(locked: AdapterVersion) -> list[loading.EndpointOutcome]:
        return await _load(settings, policy, locked, client)

    result = await lifecycle.start_canary(
        engine,
        version.id,
        actor=actor,
        share=policy.promotion.canary_share,
        reason=reason,
        evaluation=evaluation,
        prepare=load,
    )
    return ActionResult(result, result.prepared or [], gates)


async def _supersede_canary(
    engine: AsyncEngine,
    settings: Settings,
    version: AdapterVersion,
    *,
    actor: str,
    reason: str,
    client: httpx.AsyncClient | None,
) -> ActionResult:
    """Load a newer lineage version at every endpoint, then make it the canary in place of the
    current one (which goes back to candidate; it stays loaded until the reconciler's grace)."""
    policy = policy_settings(settings, version.policy)
    await require_eval_gate(engine, settings, policy, version, client=client)

    async def load(locked: AdapterVersion) -> list[loading.EndpointOutcome]:
        return await _load(settings, policy, locked, client)

    result = await lifecycle.supersede_canary(engine, version.id, actor=actor, reason=reason, prepare=load)
    return ActionResult(result, result.prepared or [])


async def _promote(
    engine: AsyncEngine,
    settings: Settings,
    version: AdapterVersion,
    *,
    actor: str,
    reason: str | None,
    client: httpx.AsyncClient | None,
    from_statuses: tuple[VersionStatus, ...] | None = None,
    force: bool = False,
) -> ActionResult:
    if not _precheck(version, PROMOTED, from_statuses):
        return _unchanged(version)
    policy = policy_settings(settings, version.policy)
    gates = None
    if version.status == CANDIDATE:
        gates = await _require_gates(engine, settings, version, force=force, hint=" (promote with force to override)")

    async def load(locked: AdapterVersion) -> list[loading.EndpointOutcome]:
        return await _load(settings, policy, locked, client)

    result = await lifecycle.promote(
        engine, version.id, actor=actor, reason=reason, from_statuses=from_statuses, prepare=load
    )
    return ActionResult(result, result.prepared or [], gates)


async def approve(
    engine: AsyncEngine,
    settings: Settings,
    ref: str | uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
    client: httpx.AsyncClient | None = None,
) -> ActionResult:
    """The admin's yes: a candidate becomes the canary, a canary is promoted."""
    version = await lifecycle.find_version(engine, ref)
    if version.status == CANDIDATE:
        return await _start_canary(engine, settings, version, actor=actor, reason=reason or "approved", client=client)
    if version.status in (CANARY, PROMOTED):
        return await _promote(
            engine, settings, version, actor=actor, reason=reason or "approved", client=client, from_statuses=(CANARY,)
        )
    raise TransitionError(
        f"adapter version {version.name} is {version.status}: only a candidate or a canary can be approved",
        current=version.status,
    )


async def promote_now(
    engine: AsyncEngine,
    settings: Settings,
    ref: str | uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
    force: bool = False,
    client: httpx.AsyncClient | None = None,
) -> ActionResult:
    """Promote at once, skipping (or cutting short) the canary; a retired version: a rollback."""
    version = await lifecycle.find_version(engine, ref)
    return await _promote(
        engine, settings, version, actor=actor, reason=reason or "promoted by an admin", client=client, force=force
    )


async def reject(
    engine: AsyncEngine, settings: Settings, ref: str | uuid.UUID, *, actor: str, reason: str | None = None
) -> ActionResult:
    """The admin's no. Rejecting the canary rejects its whole lineage (the versions it grew
    from and those trained on top of it), as an automatic loss does: the learner starts again
    from the promoted version. Any other version is rejected alone."""
    version = await lifecycle.find_version(engine, ref)
    policy_settings(settings, version.policy)
    _precheck(version, REJECTED)
    reason = reason or "rejected"
    if version.status == CANARY:
        rejected = await lifecycle.reject_lineage(engine, version.policy, actor=actor, reason=reason)
        mine = next((v for v in rejected if v.id == version.id), None)
        if mine is not None:
            others = [v for v in rejected if v.id != version.id]
            return ActionResult(TransitionResult(mine, changed=True, from_status=CANARY, side_effects=others))
    return ActionResult(await lifecycle.reject(engine, version.id, actor=actor, reason=reason))


async def rollback(
    engine: AsyncEngine,
    settings: Settings,
    policy: str,
    ref: str | uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
    client: httpx.AsyncClient | None = None,
) -> ActionResult:
    """Promote a retired version of `policy` again; the promoted one is retired."""
    policy_settings(settings, policy)
    version = await lifecycle.find_version(engine, ref, policy=policy)
    return await _promote(
        engine, settings, version, actor=actor, reason=reason or "rollback", client=client, from_statuses=(RETIRED,)
    )


async def set_paused(engine: AsyncEngine, settings: Settings, policy: str, paused: bool, *, actor: str) -> PolicyState:
    policy_settings(settings, policy)
    return await lifecycle.set_learning_paused(engine, policy, paused, actor=actor)


# ---------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class CanaryEvaluation:
    """The lineage's comparison with the promoted version, and what an automatic policy does now."""

    decision: str  # evaluation.PROMOTE | REJECT | TIMEOUT | WAIT | REVIEW
    document: dict[str, Any]  # stored in adapter_versions.evaluation (JSON-safe numbers)

    @property
    def summary(self) -> str:
        """The interval in words, for transition reasons and the job's report."""
        document = self.document
        interval = document.get("interval") or {}
        if not interval:
            return f"n={document['canary']['n']}/{document['incumbent']['n']}"
        return (
            f"mean difference {interval['difference']:+.4f}, {document['confidence']:.0%} interval "
            f"[{interval['low']:+.4f}, {interval['high']:+.4f}] ({document['method']}, "
            f"n={document['canary']['n']} vs {document['incumbent']['n']})"
        )


async def evaluate_canary(
    engine: AsyncEngine, settings: Settings, version: AdapterVersion, now: datetime | None = None
) -> CanaryEvaluation:
    """Compare the canary's lineage, and the canary alone, with the promoted version.

    The lineage's arm runs from its first canary start (`lifecycle.lineage_started_at`), not
    from the latest move of the canary, so the evidence gathered by the versions the canary
    superseded keeps counting; the canary's own arm runs from when it became the canary. The
    top-level `canary`, `incumbent` and `interval` of the document are the lineage's
    comparison; `newest` holds the canary's own.
    """
    policy = policy_settings(settings, version.policy)
    promotion = policy.promotion
    reward_name = policy.learning.reward_name
    now = now or _now()
    async with engine.connect() as connection:
        newest_since = await lifecycle.last_transition_at(connection, version.id, CANARY) or version.updated_at
        since = min(await lifecycle.lineage_started_at(connection, version.policy) or newest_since, newest_since)
        versions = await lifecycle.versions_of(connection, version.policy, (CANDIDATE, CANARY, PROMOTED))
        incumbent = promoted_version(versions)
        lineage = lineage_versions(versions)
        found = await ev.canary_units(
            connection,
            version.policy,
            [v.id for v in lineage],
            version.id,
            newest_since,
            incumbent.id if incumbent else None,
            since,
            now - timedelta(seconds=promotion.settle_s),
            reward_name,
        )
    options: dict[str, Any] = {
        "method": promotion.method,
        "min_samples": promotion.min_samples,
        "reward_range": policy.reward_range,
    }
    # The false-verdict budget 1 - confidence is shared: most for the lineage's test, the rest
    # spent over the lineage's successive newest versions (the k-th gets 6 / (pi k)^2 of it).
    position = next((i for i, v in enumerate(lineage, 1) if v.id == version.id), len(lineage) + 1)
    lineage_alpha, newest_alpha = ev.alpha_split(1.0 - promotion.confidence, newest_index=position)
    # Off the event loop: a bootstrap over large arms takes seconds of pure Python, and the
    # admin API calls this when a version is opened.
    comparison = await asyncio.to_thread(ev.compare, found.lineage, confidence=1.0 - lineage_alpha, **options)
    newest = await asyncio.to_thread(ev.compare, found.newest, confidence=1.0 - newest_alpha, **options)
    elapsed = (now - since).total_seconds()
    decision = ev.decide_lineage(
        comparison, newest, mode=promotion.mode, elapsed_s=elapsed, timeout_s=promotion.timeout_s
    )
    extra: dict[str, Any] = {}
    if policy.teacher is not None and incumbent is None:
        # Behind its teacher: the incumbent arm is the teacher's; the question is takeover (takeover.py).
        async with engine.connect() as connection:
            policy_calls, teacher_calls = await takeover.arm_calls(
                connection, version.policy, policy.teacher.model, [v.id for v in lineage] + [version.id], since
            )
        verdict = takeover.decide_takeover(
            comparison,
            newest,
            policy_calls,
            teacher_calls,
            teacher=policy.teacher,
            teacher_price=takeover.teacher_prices(settings, policy.teacher),
            policy_price=takeover.policy_prices(policy),
            mode=promotion.mode,
            elapsed_s=elapsed,
            timeout_s=promotion.timeout_s,
        )
        decision = verdict.decision
        extra["takeover"] = verdict.document
    document = {
        **comparison.as_json(),
        "verdict": comparison.verdict,
        "decision": decision,
        "mode": promotion.mode,
        "canary_since": since.isoformat(),
        "newest_since": newest_since.isoformat(),
        "newest": {**newest.as_json(), "verdict": newest.verdict, "version": version.name},
        "lineage": [v.name for v in lineage if v.id != version.id] + [version.name],
        "elapsed_s": round(elapsed, 3),
        "timeout_s": promotion.timeout_s,
        "timed_out": elapsed >= promotion.timeout_s,
        "incumbent_version_id": str(incumbent.id) if incumbent else None,
        "incumbent_name": incumbent.name if incumbent else None,
        "reward_name": reward_name,
        "evaluated_at": now.isoformat(),
        **extra,
    }
    return CanaryEvaluation(decision, {k: (json_number(v) if isinstance(v, float) else v) for k, v in document.items()})


# ---------------------------------------------------------------- the periodic job


async def promotion_tick(
    engine: AsyncEngine,
    settings: Settings,
    *,
    client: httpx.AsyncClient | None = None,
    now: datetime | None = None,
    policies: list[str] | None = None,
) -> TickReport:
    """One pass of the promotion job over every configured policy (or only `policies`).

    Call it periodically (the learner's scheduler does, every 30 s by default, and right
    after a run produced a candidate). Several processes may call it at once: each policy is
    handled by one of them at a time (advisory lock), and every transition is a locked,
    idempotent transaction anyway. Returns what it did (`TickReport.actions`) and what
    failed (`TickReport.errors`); it raises only for programming errors.

    `now` is a time on the database's clock (the default: `database_now`), the clock that
    wrote every timestamp the job compares with; a test that wants to be past a grace period
    passes `database_now(engine) + grace`.
    """
    report = TickReport()
    own = client is None
    client = client or httpx.AsyncClient(timeout=120.0)
    try:
        for policy in settings.policies:
            if policies is not None and policy.name not in policies:
                continue
            try:
                await _tick_policy_once(engine, settings, policy, report, client, now or await database_now(engine))
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
) -> None:
    """`_PolicyPass` under the policy's advisory lock; skipped while another process holds it."""
    key = f"apprentice.promotion.{policy.name}"
    async with engine.connect() as lock_connection:
        got = (await lock_connection.execute(text("SELECT pg_try_advisory_lock(hashtext(:k))"), {"k": key})).scalar()
        await lock_connection.commit()
        if not got:
            report.add(policy.name, None, "skipped", "another process is handling this policy")
            return
        try:
            async with engine.connect() as connection:
                paused = await lifecycle.learning_paused(connection, policy.name)
            await _PolicyPass(engine, settings, policy, report, client, now, paused).run()
        finally:
            try:
                await lock_connection.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})
                await lock_connection.commit()
            except DBAPIError as exc:  # the connection died (a restart): its session lock died with it
                if not exc.connection_invalidated:
                    raise


def run_promotion_tick(settings: Settings, database_url: str, *, policies: list[str] | None = None) -> TickReport:
    """`promotion_tick` for synchronous callers (the learner's scheduler threads): its own
    event loop and a small engine, disposed afterwards."""
    import asyncio

    from apprentice.store.engine import make_async_engine

    async def once() -> TickReport:
        engine = make_async_engine(database_url, pool_size=2, max_overflow=2)
        try:
            return await promotion_tick(engine, settings, policies=policies)
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
        await self.gate_lineage()
        await self.judge_canary()
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
                result = await _start_canary(
                    self.engine, self.settings, newest, actor=AUTO, client=self.client, reason=reason, files=True
                )
            else:
                reason = f"gates passed; the canary follows its lineage from {replacing.name}"
                result = await _supersede_canary(
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
            result = await _promote(
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


# ---------------------------------------------------------------- 3. the reconciler


async def reconcile(
    engine: AsyncEngine,
    policy: PolicySettings,
    *,
    report: TickReport | None = None,
    client: httpx.AsyncClient | None = None,
    now: datetime | None = None,
    discovery: EndpointDiscoverySettings | None = None,
) -> TickReport:
    """Load serving versions where an endpoint lost them (a restarted server, or a new replica
    a DNS entry resolves to now); unload the others (retired, rejected, superseded canaries)
    after the grace. `now` is on the database's clock (`database_now`): the grace is measured
    from transitions the database time-stamped. `discovery`: how DNS entries are resolved."""
    report = report or TickReport()
    endpoints, unresolved = await current_endpoints(discovery or EndpointDiscoverySettings(), policy)
    report.errors.extend(f"{policy.name}: endpoint {name} has not resolved to any address" for name in unresolved)
    if not endpoints:
        return report
    now = now or await database_now(engine)
    api_key = resolve_secret(policy.api_key)
    versions, last = await _versions_and_last_changes(engine, policy.name)
    loaded = await loading.loaded_at(endpoints, api_key=api_key, client=client)
    for endpoint, models in loaded.items():
        if isinstance(models, str):
            report.errors.append(f"{policy.name}: {endpoint} did not list its models: {models}")
            continue
        for version in versions:
            if version.status.serving and version.name not in models:
                try:
                    await loading.ensure_loaded([endpoint], version.name, version.path, api_key=api_key, client=client)
                    report.add(policy.name, version.name, "reloaded", f"{endpoint} had lost it")
                except loading.LoadError as exc:
                    report.errors.append(f"{policy.name}: {exc}")
            elif not version.status.serving and version.name in models:
                if _past_grace(policy, version, last, now):
                    await _unload_unless_serving(engine, policy, version, endpoint, api_key, client, report)
    return report


async def _versions_and_last_changes(
    engine: AsyncEngine, policy: str
) -> tuple[list[AdapterVersion], dict[uuid.UUID, datetime]]:
    """Every version of the policy (every status: a canary the lineage moved past is a candidate
    again, still served until the grace ends) and when each last changed status."""
    async with engine.connect() as connection:
        versions = await lifecycle.versions_of(connection, policy, tuple(VersionStatus))
        last = await lifecycle.last_status_changes(connection, policy)
    return versions, last


def _past_grace(
    policy: PolicySettings, version: AdapterVersion, last: dict[uuid.UUID, datetime], now: datetime
) -> bool:
    """Whether a version that stopped serving did so at least `unload_grace_s` ago."""
    changed_at = last.get(version.id) or version.updated_at
    return (now - changed_at).total_seconds() >= policy.promotion.unload_grace_s


async def sync_adapter_store(
    engine: AsyncEngine, policy: PolicySettings, *, report: TickReport | None = None, now: datetime | None = None
) -> TickReport:
    """Make the policy's adapter store hold exactly what serves (plus what is in its grace).

    Serving versions missing from the store (published by a process without the files, a
    wiped volume, a store configured after they started serving) are published; versions that
    stopped serving are removed `unload_grace_s` after their last transition, as the endpoints
    unload them; temporary directories a killed publisher left are swept. `now` is on the
    database's clock (`database_now`)."""
    report = report or TickReport()
    store = AdapterStore.for_policy(policy)
    if store is None:
        return report
    now = now or await database_now(engine)
    versions, last = await _versions_and_last_changes(engine, policy.name)
    objects = ObjectStore.for_policy(policy)
    try:
        uploaded = await asyncio.to_thread(objects.names) if objects is not None else set()
    except Exception as exc:  # the bucket did not answer: the directory store is kept in step all the same
        report.errors.append(f"{policy.name}: adapter store {objects.url if objects else ''}: {exc}")
        objects, uploaded = None, set()
    for version in versions:
        try:
            if version.status.serving:
                outcome = await asyncio.to_thread(store.publish, version.name, version.path, version.id)
                if outcome != "present":
                    report.add(policy.name, version.name, "published", f"{store.location(version.name)} ({outcome})")
                if objects is not None:
                    location = store.location(version.name)
                    if await asyncio.to_thread(objects.upload, version.name, location) != "present":
                        report.add(policy.name, version.name, "uploaded", objects.key(version.name))
            elif _past_grace(policy, version, last, now) and (
                version.name in uploaded or await asyncio.to_thread(store.holds, version.name)
            ):
                await _unpublish_unless_serving(engine, store, objects, version, report)
        except (PublishError, ValueError) as exc:  # ValueError: a name the store cannot hold (location)
            report.errors.append(f"{policy.name}: {exc}")
    for leftover in await asyncio.to_thread(store.sweep):
        report.add(policy.name, None, "store_swept", str(leftover))
    return report


async def _unpublish_unless_serving(
    engine: AsyncEngine, store: AdapterStore, objects: ObjectStore | None, version: AdapterVersion, report: TickReport
) -> None:
    """Remove a version's published copy under the policy lock, after re-reading its status: a
    rollback that publishes it again waits for the lock and then publishes it anew."""
    async with engine.begin() as connection:
        await lifecycle.lock_policy(connection, version.policy)
        current = await lifecycle.get_version(connection, version.id)
        if current.status.serving:
            return
        if await asyncio.to_thread(store.remove, version.name):
            where = f"{store.location(version.name)} ({current.status})"
            report.add(version.policy, version.name, "unpublished", where)
        if objects is not None and await asyncio.to_thread(objects.remove, version.name):
            report.add(version.policy, version.name, "unpublished", f"{objects.url}/{version.name} ({current.status})")


async def _unload_unless_serving(
    engine: AsyncEngine,
    policy: PolicySettings,
    version: AdapterVersion,
    endpoint: str,
    api_key: str | None,
    client: httpx.AsyncClient | None,
    report: TickReport,
) -> None:
    """Unload under the policy lock, after re-reading the status: a rollback that loads the same
    version waits for the lock and then finds it gone (and loads it again) instead of
    committing a promotion of an adapter this unload removes behind its back."""
    async with engine.begin() as connection:
        await lifecycle.lock_policy(connection, policy.name)
        current = await lifecycle.get_version(connection, version.id)
        if current.status.serving:
            return
        try:
            await loading.unload([endpoint], version.name, api_key=api_key, client=client)
            report.add(policy.name, version.name, "unloaded", f"{endpoint} ({current.status})")
        except loading.LoadError as exc:
            report.errors.append(f"{policy.name}: {exc}")


# ---------------------------------------------------------------- reads for the admin API


@dataclass(frozen=True)
class PolicySummary:
    """A configured policy with what serves it now and what waits."""

    policy: PolicySettings
    state: PolicyState | None  # None: never paused or resumed
    promoted: AdapterVersion | None
    canary: AdapterVersion | None
    candidates: int
    lineage: list[AdapterVersion]  # the live lineage, oldest first (`lineage.lineage_versions`)
    lineage_head: AdapterVersion | None  # what the next learner run continues; None: the base model

    @property
    def learning_paused(self) -> bool:
        return self.state is not None and self.state.learning_paused

    @property
    def paused_by(self) -> str | None:
        return self.state.updated_by if self.state is not None and self.state.learning_paused else None


@dataclass(frozen=True)
class VersionDetail:
    """A version (for a canary: with its evaluation computed now), its training run and transitions."""

    version: AdapterVersion
    training_run: TrainingRun | None
    transitions: list[Transition]
    provenance: Provenance
    lineage_head: AdapterVersion | None


@dataclass(frozen=True)
class VersionListing:
    """A policy's versions, newest first, each with its provenance, and the lineage's head."""

    versions: list[AdapterVersion]
    provenance: dict[uuid.UUID, Provenance]
    lineage_head: AdapterVersion | None


async def list_policies(engine: AsyncEngine, settings: Settings) -> list[PolicySummary]:
    async with engine.connect() as connection:
        states = await lifecycle.policy_states(connection)
        versions = await lifecycle.versions_of(connection, None, (CANDIDATE, *SERVING))
    summaries = []
    for policy in settings.policies:
        own = [version for version in versions if version.policy == policy.name]
        by_status = {version.status: version for version in own if version.status.serving}
        lineage = lineage_versions(own)
        summaries.append(
            PolicySummary(
                policy,
                states.get(policy.name),
                by_status.get(PROMOTED),
                by_status.get(CANARY),
                sum(1 for v in lineage if v.status == CANDIDATE),
                lineage,
                lineage_head(own),
            )
        )
    return summaries


async def list_versions(
    engine: AsyncEngine, settings: Settings, policy: str, status: VersionStatus | None = None
) -> list[AdapterVersion]:
    """A configured policy's versions (only those in `status`, when given), newest first."""
    policy_settings(settings, policy)
    async with engine.connect() as connection:
        versions = await lifecycle.versions_of(connection, policy, (status,) if status else tuple(VersionStatus))
    return versions[::-1]


async def version_listing(
    engine: AsyncEngine, settings: Settings, policy: str, status: VersionStatus | None = None
) -> VersionListing:
    """`list_versions` with each version's parent, lineage membership, samples and samplers."""
    policy_settings(settings, policy)
    async with engine.connect() as connection:
        every = await lifecycle.versions_of(connection, policy, tuple(VersionStatus))
        shown = [v for v in every if status is None or v.status == status][::-1]
        found = await provenance(connection, shown, every)
    return VersionListing(shown, found, lineage_head(every))


async def version_detail(engine: AsyncEngine, settings: Settings, ref: str | uuid.UUID) -> VersionDetail:
    """A version with its training run, gates, canary statistics (live for a canary) and transitions."""
    version = await lifecycle.find_version(engine, ref)
    async with engine.connect() as connection:
        transitions = await lifecycle.transitions_of(connection, version.id)
        every = await lifecycle.versions_of(connection, version.policy, tuple(VersionStatus))
        found = (await provenance(connection, [version], every))[version.id]
    run = await training_run_of(engine, version)
    if version.status == CANARY and settings.policy(version.policy) is not None:
        live = await evaluate_canary(engine, settings, version)
        version = dataclasses.replace(version, evaluation=live.document)
    return VersionDetail(version, run, transitions, found, lineage_head(every))
