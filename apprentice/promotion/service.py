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

1. candidates: gates (run succeeded, loss finite, KL under the bound); failures are
   rejected (actor "auto"); with `auto_canary` and no canary running, the newest passing
   candidate becomes the canary at the policy's `canary_share` (older ones are rejected as
   superseded);
2. the canary: its rewards are compared with the promoted version's over the canary period
   and the comparison stored in `adapter_versions.evaluation`; an `automatic` policy
   promotes a significantly better canary, rejects a significantly worse one, and rejects
   one that reaches `timeout_s` without a verdict; a `reviewed` policy waits for an admin;
3. the reconciler: serving versions missing at an endpoint (restarted server) are loaded
   again; retired and rejected versions past the grace period are unloaded;
4. retention: files of old, never-promoted versions are deleted.

A paused policy (admin "pause") gets no automatic canary starts or promotions; a
significantly worse canary is still rejected.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import PolicySettings, Settings, resolve_secret
from apprentice.store.tables import adapter_transitions, adapter_versions, policy_state, training_runs
from apprentice.promotion import evaluation as ev
from apprentice.promotion import lifecycle, loading
from apprentice.promotion.gates import FAIL, PASS, GateReport, evaluate_gates, json_number
from apprentice.promotion.lifecycle import TransitionError, TransitionResult, VersionNotFound
from apprentice.promotion.retention import apply_retention

log = logging.getLogger(__name__)

AUTO = "auto"

__all__ = ["AUTO", "ActionResult", "PolicyNotConfigured", "TickReport", "TransitionError", "VersionNotFound",
           "approve", "promote_now", "reject", "rollback", "set_paused", "promotion_tick", "run_promotion_tick", "reconcile",
           "evaluate_canary", "check_gates", "list_policies", "list_versions", "version_detail"]


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


def policy_settings(settings: Settings, name: str) -> PolicySettings:
    policy = settings.policy(name)
    if policy is None:
        raise PolicyNotConfigured(name)
    return policy


def reward_name(policy: PolicySettings) -> str:
    learning = getattr(policy, "learning", None)
    return getattr(learning, "reward_name", None) or "reward"


async def _load(policy: PolicySettings, version: dict[str, Any],
                client: httpx.AsyncClient | None) -> list[loading.EndpointOutcome]:
    if version["files_deleted_at"] is not None:
        raise TransitionError(f"adapter version {version['name']} cannot serve: its files were deleted at "
                              f"{version['files_deleted_at'].isoformat()} (retention)", current=version["status"])
    return await loading.ensure_loaded(policy.endpoints, version["name"], version["path"],
                                       api_key=resolve_secret(policy.api_key), client=client)


def _precheck(version: dict[str, Any], to_status: str, from_statuses: tuple[str, ...] | None = None) -> bool:
    """True when there is something to do; TransitionError when it is not allowed (before loading)."""
    if version["status"] == to_status:
        return False
    allowed = lifecycle.ALLOWED[to_status] & frozenset(from_statuses or lifecycle.ALLOWED[to_status])
    if version["status"] not in allowed:
        raise lifecycle._refuse(version, to_status, allowed)
    return True


# ---------------------------------------------------------------- gates

async def training_run_of(engine: AsyncEngine, version: dict[str, Any]) -> dict[str, Any] | None:
    query = select(training_runs)
    if version.get("training_run_id") is not None:
        query = query.where(training_runs.c.id == version["training_run_id"])
    else:  # the learner may only have filled training_runs.produced_version_id
        query = query.where(training_runs.c.produced_version_id == version["id"])
    async with engine.connect() as connection:
        row = (await connection.execute(query.order_by(training_runs.c.started_at.desc()).limit(1))).first()
    return dict(row._mapping) if row is not None else None


async def check_gates(engine: AsyncEngine, settings: Settings, version: dict[str, Any]) -> GateReport:
    """Evaluate the gates of a version's training run and store them in `adapter_versions.gates`."""
    policy = policy_settings(settings, version["policy"])
    report = evaluate_gates(await training_run_of(engine, version), policy.promotion.kl_bound)
    document = {**report.as_json(), "kl_bound": policy.promotion.kl_bound, "checked_at": _now().isoformat()}
    if version.get("gates", {}).get("outcome") != report.outcome or report.outcome != "wait":
        await lifecycle.update_jsonb(engine, version["id"], "gates", document)
    return report


# ---------------------------------------------------------------- admin actions

async def _start_canary(engine: AsyncEngine, settings: Settings, version: dict[str, Any], *, actor: str,
                        reason: str | None, client: httpx.AsyncClient | None, force: bool = False) -> ActionResult:
    if not _precheck(version, "canary"):
        return ActionResult(TransitionResult(version, False, version["status"]))
    policy = policy_settings(settings, version["policy"])
    gates = await check_gates(engine, settings, version)
    if not gates.passed and not force:
        detail = "; ".join(gates.failures()) or "the training run has not finished"
        raise TransitionError(f"adapter version {version['name']} does not pass the gates: {detail}",
                              current=version["status"])
    async with engine.connect() as connection:
        serving = await lifecycle.serving_versions(connection, version["policy"])
    if "canary" in serving:
        raise TransitionError(f"policy {version['policy']!r} already has a canary ({serving['canary']['name']}): "
                              "promote or reject it first", current=version["status"])
    incumbent = serving.get("promoted")
    evaluation = {"incumbent_version_id": str(incumbent["id"]) if incumbent else None,
                  "incumbent_name": incumbent["name"] if incumbent else None, "verdict": ev.INSUFFICIENT}
    result = await lifecycle.start_canary(engine, version["id"], actor=actor, share=policy.promotion.canary_share,
                                          reason=reason, evaluation=evaluation,
                                          prepare=lambda locked: _load(policy, locked, client))
    return ActionResult(result, result.prepared or [], gates)


async def _promote(engine: AsyncEngine, settings: Settings, version: dict[str, Any], *, actor: str,
                   reason: str | None, client: httpx.AsyncClient | None,
                   from_statuses: tuple[str, ...] | None = None, force: bool = False) -> ActionResult:
    if not _precheck(version, "promoted", from_statuses):
        return ActionResult(TransitionResult(version, False, version["status"]))
    policy = policy_settings(settings, version["policy"])
    gates = None
    if version["status"] == "candidate":
        gates = await check_gates(engine, settings, version)
        if not gates.passed and not force:
            detail = "; ".join(gates.failures()) or "the training run has not finished"
            raise TransitionError(f"adapter version {version['name']} does not pass the gates: {detail} "
                                  "(promote with force to override)", current=version["status"])
    result = await lifecycle.promote(engine, version["id"], actor=actor, reason=reason, from_statuses=from_statuses,
                                     prepare=lambda locked: _load(policy, locked, client))
    return ActionResult(result, result.prepared or [], gates)


async def approve(engine: AsyncEngine, settings: Settings, ref: str | uuid.UUID, *, actor: str,
                  reason: str | None = None, client: httpx.AsyncClient | None = None) -> ActionResult:
    """The admin's yes: a candidate becomes the canary, a canary is promoted."""
    version = await lifecycle.find_version(engine, ref)
    if version["status"] == "candidate":
        return await _start_canary(engine, settings, version, actor=actor, reason=reason or "approved", client=client)
    if version["status"] in ("canary", "promoted"):
        return await _promote(engine, settings, version, actor=actor, reason=reason or "approved", client=client,
                              from_statuses=("canary",))
    raise TransitionError(f"adapter version {version['name']} is {version['status']}: only a candidate or a canary "
                          "can be approved", current=version["status"])


async def promote_now(engine: AsyncEngine, settings: Settings, ref: str | uuid.UUID, *, actor: str,
                      reason: str | None = None, force: bool = False,
                      client: httpx.AsyncClient | None = None) -> ActionResult:
    """Promote at once, skipping (or cutting short) the canary; a retired version: a rollback."""
    version = await lifecycle.find_version(engine, ref)
    return await _promote(engine, settings, version, actor=actor, reason=reason or "promoted by an admin",
                          client=client, force=force)


async def reject(engine: AsyncEngine, settings: Settings, ref: str | uuid.UUID, *, actor: str,
                 reason: str | None = None) -> ActionResult:
    version = await lifecycle.find_version(engine, ref)
    policy_settings(settings, version["policy"])
    _precheck(version, "rejected")
    return ActionResult(await lifecycle.reject(engine, version["id"], actor=actor, reason=reason or "rejected"))


async def rollback(engine: AsyncEngine, settings: Settings, policy: str, ref: str | uuid.UUID, *, actor: str,
                   reason: str | None = None, client: httpx.AsyncClient | None = None) -> ActionResult:
    """Promote a retired version of `policy` again; the promoted one is retired."""
    policy_settings(settings, policy)
    version = await lifecycle.find_version(engine, ref, policy=policy)
    return await _promote(engine, settings, version, actor=actor, reason=reason or "rollback", client=client,
                          from_statuses=("retired",))


async def set_paused(engine: AsyncEngine, settings: Settings, policy: str, paused: bool, *,
                     actor: str) -> dict[str, Any]:
    policy_settings(settings, policy)
    return await lifecycle.set_learning_paused(engine, policy, paused, actor=actor)


# ---------------------------------------------------------------- evaluation

async def evaluate_canary(engine: AsyncEngine, settings: Settings, version: dict[str, Any],
                          now: datetime | None = None) -> dict[str, Any]:
    """The canary's comparison with the promoted version now, and what an automatic policy does."""
    policy = policy_settings(settings, version["policy"])
    settings_p = policy.promotion
    now = now or _now()
    async with engine.connect() as connection:
        since = await lifecycle.last_transition_at(connection, version["id"], "canary") or version["updated_at"]
        incumbent = (await lifecycle.serving_versions(connection, version["policy"])).get("promoted")
        canary, base = await ev.arm_rewards(connection, version["policy"], version["id"],
                                            incumbent["id"] if incumbent else None, since, reward_name(policy))
    comparison = ev.compare(canary, base, method=settings_p.method, confidence=settings_p.confidence,
                            min_samples=settings_p.min_samples)
    elapsed = (now - since).total_seconds()
    decision = ev.decide(comparison, mode=settings_p.mode, elapsed_s=elapsed, timeout_s=settings_p.timeout_s)
    document = comparison.as_json()
    return {**document, "verdict": comparison.verdict, "decision": decision, "mode": settings_p.mode,
            "canary_since": since.isoformat(), "elapsed_s": round(elapsed, 3), "timeout_s": settings_p.timeout_s,
            "timed_out": elapsed >= settings_p.timeout_s,
            "incumbent_version_id": str(incumbent["id"]) if incumbent else None,
            "incumbent_name": incumbent["name"] if incumbent else None,
            "reward_name": reward_name(policy), "evaluated_at": now.isoformat()}


def _interval_text(evaluation: dict[str, Any]) -> str:
    interval = evaluation.get("interval") or {}
    if not interval:
        return f"n={evaluation['canary']['n']}/{evaluation['incumbent']['n']}"
    return (f"mean difference {interval['difference']:+.4f}, {evaluation['confidence']:.0%} interval "
            f"[{interval['low']:+.4f}, {interval['high']:+.4f}] ({evaluation['method']}, "
            f"n={evaluation['canary']['n']} vs {evaluation['incumbent']['n']})")


# ---------------------------------------------------------------- the periodic job

async def promotion_tick(engine: AsyncEngine, settings: Settings, *, client: httpx.AsyncClient | None = None,
                         now: datetime | None = None, policies: list[str] | None = None) -> TickReport:
    """One pass of the promotion job over every configured policy (or only `policies`).

    Call it periodically (the learner's scheduler does, every 30 s by default, and right
    after a run produced a candidate). Several processes may call it at once: each policy is
    handled by one of them at a time (advisory lock), and every transition is a locked,
    idempotent transaction anyway. Returns what it did (`TickReport.actions`) and what
    failed (`TickReport.errors`); it raises only for programming errors.
    """
    report = TickReport()
    own = client is None
    client = client or httpx.AsyncClient(timeout=120.0)
    try:
        for policy in settings.policies:
            if policies is not None and policy.name not in policies:
                continue
            try:
                async with engine.connect() as lock_connection:
                    key = f"apprentice.promotion.{policy.name}"
                    got = (await lock_connection.execute(text("SELECT pg_try_advisory_lock(hashtext(:k))"),
                                                         {"k": key})).scalar()
                    await lock_connection.commit()
                    if not got:
                        report.add(policy.name, None, "skipped", "another process is handling this policy")
                        continue
                    try:
                        await _tick_policy(engine, settings, policy, report, client, now or _now())
                    finally:
                        await lock_connection.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})
                        await lock_connection.commit()
            except Exception as exc:  # one policy's trouble must not stop the others
                log.exception("promotion tick failed for policy %s", policy.name)
                report.errors.append(f"{policy.name}: {type(exc).__name__}: {exc}")
    finally:
        if own:
            await client.aclose()
    return report


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


async def _tick_policy(engine: AsyncEngine, settings: Settings, policy: PolicySettings, report: TickReport,
                       client: httpx.AsyncClient, now: datetime) -> None:
    name = policy.name
    async with engine.connect() as connection:
        paused = await lifecycle.learning_paused(connection, name)
        candidates = [dict(row._mapping) for row in await connection.execute(
            select(adapter_versions).where(adapter_versions.c.policy == name,
                                           adapter_versions.c.status == "candidate")
            .order_by(adapter_versions.c.version))]
        serving = await lifecycle.serving_versions(connection, name)

    # 1. gates, then the newest passing candidate becomes the canary
    passing = []
    for version in candidates:
        gates = await check_gates(engine, settings, version)
        if gates.outcome == FAIL:
            await _auto(report, name, version, "rejected", lifecycle.reject(
                engine, version["id"], actor=AUTO, from_statuses=("candidate",),
                reason="gates failed: " + "; ".join(gates.failures())))
        elif gates.outcome == PASS:
            passing.append(version)
    if passing and "canary" not in serving and policy.promotion.auto_canary and not paused:
        newest = passing[-1]
        try:
            result = await _start_canary(engine, settings, newest, actor=AUTO, client=client,
                                         reason=f"gates passed; canary at {policy.promotion.canary_share:.0%} "
                                                "of new trajectories")
            report.add(name, newest["name"], "canary" if result.transition.changed else "unchanged",
                       ", ".join(f"{e.endpoint} {e.action}" for e in result.endpoints))
            for older in passing[:-1]:
                await _auto(report, name, older, "rejected", lifecycle.reject(
                    engine, older["id"], actor=AUTO, from_statuses=("candidate",),
                    reason=f"superseded by the newer candidate {newest['name']}"))
        except loading.LoadError as exc:
            report.errors.append(f"{name}: {exc}")
            if exc.permanent:  # no adapter at the path, wrong base, rank too high: retrying won't help
                await _auto(report, name, newest, "rejected", lifecycle.reject(
                    engine, newest["id"], actor=AUTO, from_statuses=("candidate",),
                    reason=f"could not be loaded: {exc}"))
            else:
                report.add(name, newest["name"], "load_failed", str(exc))
        except TransitionError as exc:  # an admin acted meanwhile
            report.add(name, newest["name"], "unchanged", str(exc))

    # 2. the canary's evaluation and the automatic verdict
    async with engine.connect() as connection:
        canary = (await lifecycle.serving_versions(connection, name)).get("canary")
    if canary is not None:
        evaluation = await evaluate_canary(engine, settings, canary, now)
        await lifecycle.update_jsonb(engine, canary["id"], "evaluation", {
            k: (json_number(v) if isinstance(v, float) else v) for k, v in evaluation.items()})
        decision = evaluation["decision"]
        summary = _interval_text(evaluation)
        if decision == ev.PROMOTE and not paused:
            try:
                result = await _promote(engine, settings, canary, actor=AUTO, client=client,
                                        from_statuses=("canary",),
                                        reason=f"canary significantly better: {summary}")
                report.add(name, canary["name"], "promoted" if result.transition.changed else "unchanged", summary)
            except (loading.LoadError, TransitionError) as exc:
                report.errors.append(f"{name}: {exc}")
        elif decision == ev.REJECT:
            await _auto(report, name, canary, "rejected", lifecycle.reject(
                engine, canary["id"], actor=AUTO, from_statuses=("canary",),
                reason=f"canary significantly worse: {summary}"))
        elif decision == ev.TIMEOUT:
            await _auto(report, name, canary, "rejected", lifecycle.reject(
                engine, canary["id"], actor=AUTO, from_statuses=("canary",),
                reason=f"no significant difference within {policy.promotion.timeout_s:g}s: {summary}"))
        else:
            report.add(name, canary["name"], "evaluating" if decision == ev.WAIT else "awaiting_review", summary)

    # 3. endpoints hold what serves, and lose what stopped serving a while ago
    await reconcile(engine, policy, report=report, client=client, now=now)

    # 4. retention
    for item in await apply_retention(engine, name, keep_last=policy.promotion.keep_last,
                                      grace_s=policy.promotion.unload_grace_s, now=now):
        report.add(name, item["name"], "files_" + item["result"].split(":")[0], item["path"])


async def _auto(report: TickReport, policy: str, version: dict[str, Any], action: str, transition: Any) -> None:
    try:
        result = await transition
        report.add(policy, version["name"], action if result.changed else "unchanged",
                   result.version["status"])
    except TransitionError as exc:  # someone else moved it first
        report.add(policy, version["name"], "unchanged", str(exc))


async def reconcile(engine: AsyncEngine, policy: PolicySettings, *, report: TickReport | None = None,
                    client: httpx.AsyncClient | None = None, now: datetime | None = None) -> TickReport:
    """Load serving versions where an endpoint lost them; unload retired/rejected ones after the grace."""
    report = report or TickReport()
    if not policy.endpoints:
        return report
    now = now or _now()
    api_key = resolve_secret(policy.api_key)
    async with engine.connect() as connection:
        versions = [dict(row._mapping) for row in await connection.execute(
            select(adapter_versions).where(adapter_versions.c.policy == policy.name,
                                           adapter_versions.c.status.in_(("canary", "promoted", "retired",
                                                                          "rejected"))))]
        last = {row[0]: row[1] for row in await connection.execute(
            text("SELECT adapter_version_id, max(created_at) FROM adapter_transitions WHERE policy = :p "
                 "GROUP BY adapter_version_id"), {"p": policy.name})}
    loaded = await loading.loaded_at(policy.endpoints, api_key=api_key, client=client)
    for endpoint, models in loaded.items():
        if isinstance(models, str):
            report.errors.append(f"{policy.name}: {endpoint} did not list its models: {models}")
            continue
        for version in versions:
            if version["status"] in lifecycle.SERVING and version["name"] not in models:
                try:
                    await loading.ensure_loaded([endpoint], version["name"], version["path"], api_key=api_key,
                                                client=client)
                    report.add(policy.name, version["name"], "reloaded", f"{endpoint} had lost it")
                except loading.LoadError as exc:
                    report.errors.append(f"{policy.name}: {exc}")
            elif version["status"] not in lifecycle.SERVING and version["name"] in models:
                changed_at = last.get(version["id"]) or version["updated_at"]
                if (now - changed_at).total_seconds() >= policy.promotion.unload_grace_s:
                    await _unload_unless_serving(engine, policy, version, endpoint, api_key, client, report)
    return report


async def _unload_unless_serving(engine: AsyncEngine, policy: PolicySettings, version: dict[str, Any], endpoint: str,
                                 api_key: str | None, client: httpx.AsyncClient | None, report: TickReport) -> None:
    """Unload under the policy lock, after re-reading the status: a rollback that loads the same
    version waits for the lock and then finds it gone (and loads it again) instead of
    committing a promotion of an adapter this unload removes behind its back."""
    async with engine.begin() as connection:
        await lifecycle.lock_policy(connection, policy.name)
        current = await lifecycle.get_version(connection, version["id"])
        if current["status"] in lifecycle.SERVING:
            return
        try:
            await loading.unload([endpoint], version["name"], api_key=api_key, client=client)
            report.add(policy.name, version["name"], "unloaded", f"{endpoint} ({current['status']})")
        except loading.LoadError as exc:
            report.errors.append(f"{policy.name}: {exc}")


# ---------------------------------------------------------------- reads for the admin API

def _brief(version: dict[str, Any] | None) -> dict[str, Any] | None:
    if version is None:
        return None
    return {"id": str(version["id"]), "name": version["name"], "version": version["version"],
            "status": version["status"], "canary_share": version.get("canary_share")}


async def list_policies(engine: AsyncEngine, settings: Settings) -> list[dict[str, Any]]:
    async with engine.connect() as connection:
        states = {row.policy: dict(row._mapping) for row in await connection.execute(select(policy_state))}
        rows = await connection.execute(select(adapter_versions).where(
            adapter_versions.c.status.in_(("candidate", "canary", "promoted"))))
        by_policy: dict[str, dict[str, Any]] = {}
        for row in rows:
            entry = by_policy.setdefault(row.policy, {"candidates": 0})
            if row.status == "candidate":
                entry["candidates"] += 1
            else:
                entry[row.status] = dict(row._mapping)
    result = []
    for policy in settings.policies:
        entry = by_policy.get(policy.name, {"candidates": 0})
        state = states.get(policy.name) or {}
        result.append({
            "name": policy.name, "base_model": policy.base_model, "endpoints": policy.endpoints,
            "promotion": policy.promotion.model_dump(mode="json"),
            "learning_paused": bool(state.get("learning_paused", False)),
            "paused_by": state.get("updated_by") if state.get("learning_paused") else None,
            "promoted": _brief(entry.get("promoted")), "canary": _brief(entry.get("canary")),
            "candidates": entry["candidates"],
        })
    return result


async def list_versions(engine: AsyncEngine, settings: Settings, policy: str,
                        status: str | None = None) -> list[dict[str, Any]]:
    policy_settings(settings, policy)
    query = select(adapter_versions).where(adapter_versions.c.policy == policy)
    if status:
        query = query.where(adapter_versions.c.status == status)
    async with engine.connect() as connection:
        return [dict(row._mapping) for row in
                await connection.execute(query.order_by(adapter_versions.c.version.desc()))]


async def version_detail(engine: AsyncEngine, settings: Settings, ref: str | uuid.UUID) -> dict[str, Any]:
    """A version with its training run, gates, canary statistics (live for a canary) and transitions."""
    version = await lifecycle.find_version(engine, ref)
    async with engine.connect() as connection:
        transitions = await lifecycle.transitions_of(connection, version["id"])
    run = await training_run_of(engine, version)
    detail = {**version, "training_run": run, "transitions": transitions}
    if version["status"] == "canary" and settings.policy(version["policy"]) is not None:
        live = await evaluate_canary(engine, settings, version)
        detail["evaluation"] = {k: (json_number(v) if isinstance(v, float) else v) for k, v in live.items()}
    return detail


async def transitions_since(engine: AsyncEngine, policy: str, since_id: int = 0) -> list[dict[str, Any]]:
    async with engine.connect() as connection:
        rows = await connection.execute(select(adapter_transitions).where(
            adapter_transitions.c.policy == policy, adapter_transitions.c.id > since_id)
            .order_by(adapter_transitions.c.id))
        return [dict(row._mapping) for row in rows]
