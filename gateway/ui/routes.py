"""The dashboard under /ui: server-rendered pages, small JSON endpoints for their live parts,
and the static files (docs/dashboard.md).

Every page needs a session (gateway/ui/session.py); every POST needs the session's CSRF token
and a same-origin request (gateway/ui/csrf.py). The actions call the same functions
as the admin API (`apprentice.promotion.actions`, `gateway.auth.keys`), with the session's key
name as the actor and a reason and a confirmation that the server requires.
"""

from __future__ import annotations

import hashlib
import mimetypes
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from apprentice.evalsets import store as evalsets
from apprentice.promotion import actions, listing, policies, serving
from apprentice.promotion.lifecycle import TransitionError, VersionNotFound
from apprentice.promotion.loading import LoadError
from apprentice.promotion.teacher_view import teacher_status
from gateway.auth.keys import create_key, list_keys, revoke_key
from gateway.http.errors import GatewayError
from gateway.judging.agreement import AgreementReport, Bucket
from gateway.judging.agreement_store import policy_agreement
from gateway.state import GatewayState
from gateway.store.rewards import get_reward
from gateway.store.trajectories import get_trajectory
from gateway.ui import queries
from gateway.ui.conversation import conversation
from gateway.ui.csrf import FIELD, same_origin, token_matches
from gateway.ui.render import SECURITY_HEADERS, STATIC_DIR, fragment, json_with_etag, page
from gateway.ui.session import (
    LOGIN_COOKIE,
    LOGIN_TTL_S,
    SESSION_COOKIE,
    SESSION_TTL_S,
    Session,
    Sessions,
    clear_cookie,
    set_cookie,
)

router = APIRouter(prefix="/ui", include_in_schema=False)

MAX_FORM_BYTES = 64 * 1024
POLL_MS = 5000


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def _sessions(request: Request) -> Sessions:
    sessions = getattr(request.app.state, "ui_sessions", None)
    if sessions is None:
        sessions = request.app.state.ui_sessions = Sessions(_state(request))
    assert isinstance(sessions, Sessions)
    return sessions


@dataclass(frozen=True)
class Ctx:
    session: Session
    csrf: str

    def base(self, active: str) -> dict[str, Any]:
        return {
            "actor": self.session.name,
            "csrf": self.csrf,
            "csrf_field": FIELD,
            "active": active,
            "poll_ms": POLL_MS,
        }


async def _ctx(request: Request) -> Ctx | None:
    sessions = _sessions(request)
    session = await sessions.read(request)
    if session is None:
        return None
    return Ctx(session, await sessions.csrf_token(session))


def _to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse("/ui/login?" + urlencode({"next": target}), status_code=303)


def _safe_next(value: str | None) -> str:
    if value and value.startswith("/ui/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/ui/"


async def _form(request: Request) -> dict[str, str]:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise GatewayError(413, "form too large", code="request_too_large")
    return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}


def _error_page(request: Request, status: int, title: str, message: str) -> Response:
    return page(request, "error.html", {"title": title, "message": message, "actor": None, "active": ""}, status)


async def _post(request: Request) -> tuple[Ctx, dict[str, str]] | Response:
    """The session and the form of a POST, or the refusal (login redirect, 403)."""
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    if not same_origin(request):
        return _error_page(request, 403, "Refused", "This form was not sent from this site (Origin/Referer).")
    form = await _form(request)
    if not token_matches(form.get(FIELD), ctx.csrf):
        return _error_page(request, 403, "Refused", "The form's CSRF token is missing or wrong: reload the page.")
    return ctx, form


def _confirmed(form: dict[str, str]) -> str | None:
    """Why an action's form is incomplete, or None: a reason and the confirmation are required."""
    if not form.get("reason", "").strip():
        return "Give a reason: it is recorded with the transition."
    if form.get("confirm") != "yes":
        return "Tick the confirmation box to go ahead."
    return None


async def _guard(call: Callable[[], Awaitable[Any]]) -> tuple[Any, int, str]:
    """Run a service call: (result, status, message), the errors as the admin API maps them."""
    try:
        return await call(), 200, ""
    except VersionNotFound as exc:
        return None, 404, str(exc)
    except policies.PolicyNotConfigured as exc:
        return None, 404, str(exc)
    except TransitionError as exc:
        return None, 409, str(exc)
    except LoadError as exc:
        return None, 502, str(exc)


def _parse_float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _parse_int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _parse_cursor(value: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not value or "_" not in value:
        return None
    at, _, ident = value.rpartition("_")
    when = _parse_time(at)
    try:
        return (when, uuid.UUID(ident)) if when else None
    except ValueError:
        return None


def _cursor(at: datetime, ident: uuid.UUID) -> str:
    return f"{at.isoformat()}_{ident}"


# ---------------------------------------------------------------- login


@router.get("")
async def root() -> Response:
    return RedirectResponse("/ui/", status_code=308)


@router.get("/login")
async def login_form(request: Request) -> Response:
    return await _login_page(request, "", 200)


async def _login_page(request: Request, message: str, status: int) -> Response:
    nonce = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(16)
    token = await _sessions(request).login_token(nonce)
    response = page(
        request,
        "login.html",
        {
            "message": message,
            "next": _safe_next(request.query_params.get("next")),
            "csrf": token,
            "csrf_field": FIELD,
            "actor": None,
            "active": "",
        },
        status,
    )
    set_cookie(response, request, LOGIN_COOKIE, nonce, LOGIN_TTL_S)
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    sessions = _sessions(request)
    if not same_origin(request):
        return await _login_page(request, "Refused: this form was not sent from this site.", 403)
    form = await _form(request)
    nonce = request.cookies.get(LOGIN_COOKIE)
    if not nonce or not token_matches(form.get(FIELD), await sessions.login_token(nonce)):
        return await _login_page(request, "The login form expired: try again.", 403)
    key = form.get("key", "")
    try:
        info = await sessions.check_key(key)
    except GatewayError as error:
        message = {
            401: "Wrong key: no admin key matches it.",
            403: "This key is not an admin key: the dashboard needs the admin key or a key created with --admin.",
        }.get(error.status, error.message)
        return await _login_page(request, message, error.status)
    response = RedirectResponse(_safe_next(form.get("next")), status_code=303)
    set_cookie(response, request, SESSION_COOKIE, await sessions.issue(info, key), SESSION_TTL_S)
    clear_cookie(response, request, LOGIN_COOKIE)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    checked = await _post(request)
    if isinstance(checked, Response):
        return checked
    response = RedirectResponse("/ui/login", status_code=303)
    clear_cookie(response, request, SESSION_COOKIE)
    return response


# ---------------------------------------------------------------- overview


async def _overview(state: GatewayState) -> dict[str, Any]:
    summaries = await listing.list_policies(state.engine, state.settings)
    names = [s.policy.name for s in summaries]
    rates = await queries.rates(state.engine, names)
    trends = {
        s.policy.name: queries.trend(
            await queries.recent_rewards(
                state.engine, s.policy.name, s.policy.learning.reward_name, queries.TREND_TRAJECTORIES
            )
        )
        for s in summaries
    }
    return {"summaries": summaries, "rates": rates, "trends": trends}


@router.get("/")
async def overview(request: Request) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    data = await _overview(_state(request))
    return page(request, "overview.html", {**ctx.base("overview"), **data})


@router.get("/data/overview")
async def overview_data(request: Request) -> Response:
    if await _ctx(request) is None:
        return _unauthorized()
    data = await _overview(_state(request))
    return json_with_etag(request, {"fragments": {"policy-rows": fragment("_policy_rows.html", **data)}})


def _unauthorized() -> Response:
    return Response(
        b'{"error": "log in at /ui/login"}', status_code=401, media_type="application/json", headers=SECURITY_HEADERS
    )


# ---------------------------------------------------------------- policy page


async def _policy_live(state: GatewayState, summary: listing.PolicySummary) -> dict[str, Any]:
    rows = await queries.recent_rewards(
        state.engine, summary.policy.name, summary.policy.learning.reward_name, queries.CHART_TRAJECTORIES
    )
    ids = sorted({row["adapter_version_id"] for row in rows if row["adapter_version_id"] is not None})
    chart = queries.reward_chart(rows, await queries.version_names(state.engine, ids))
    rates = (await queries.rates(state.engine, [summary.policy.name]))[summary.policy.name]
    evaluation = summary.canary.evaluation if summary.canary is not None else {}
    return {"summary": summary, "chart": chart, "rates": rates, "evaluation": evaluation, "chart_n": len(rows)}


async def _find_policy(state: GatewayState, policy: str) -> listing.PolicySummary | None:
    for summary in await listing.list_policies(state.engine, state.settings):
        if summary.policy.name == policy:
            return summary
    return None


@router.get("/policies/{policy}")
async def policy_page(request: Request, policy: str) -> Response:
    return await _policy_page(request, policy)


async def _policy_page(request: Request, policy: str, flash: str = "", status_code: int = 200) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    state = _state(request)
    summary = await _find_policy(state, policy)
    if summary is None:
        return _error_page(request, 404, "Not found", f"policy {policy!r} is not configured")
    params = request.query_params
    versions_before = _parse_int(params.get("versions_before"))
    runs_before = _parse_time(params.get("runs_before"))
    transitions_before = _parse_int(params.get("transitions_before"))
    versions, more_versions = await queries.versions_page(state.engine, policy, versions_before)
    runs_kind = _run_kind(params.get("kind"))
    runs, more_runs = await queries.runs_page(state.engine, policy, runs_before, runs_kind)
    transitions, more_transitions = await queries.transitions_page(state.engine, policy, transitions_before)
    anchor = summary.promoted or summary.lineage_head
    ancestry = await queries.ancestry(state.engine, anchor.id) if anchor is not None else []
    if summary.promoted is not None and ancestry:
        ancestry = ancestry + [
            {"name": v.name, "status": v.status.value, "version": v.version} for v in summary.lineage
        ]
    context = {
        **ctx.base("overview"),
        **await _policy_live(state, summary),
        "policy": policy,
        "ancestry": ancestry,
        "versions": versions,
        "more_versions": more_versions,
        "runs": runs,
        "more_runs": more_runs,
        "runs_kind": runs_kind,
        "transitions": transitions,
        "more_transitions": more_transitions,
        "first_page": versions_before is None and runs_before is None and transitions_before is None,
        "flash": flash,
        # docs/distillation.md: the teacher, the distilled versions and the comparison with cost and latency
        "teacher": await teacher_status(state.engine, state.settings, policy) if summary.policy.teacher else None,
        **await _eval_sets(state, summary),
    }
    return page(request, "policy.html", context, status_code)


async def _eval_sets(state: GatewayState, summary: listing.PolicySummary) -> dict[str, Any]:
    """The policy's evaluation sets with each one's latest run per scored version (docs/evaluation-sets.md)."""
    sets = await evalsets.list_sets(state.engine, summary.policy.name)
    runs: dict[uuid.UUID, list[evalsets.EvalRun]] = {}
    for run in await evalsets.runs_of(state.engine, policy=summary.policy.name, limit=200):
        shown = runs.setdefault(run.set_id, [])
        if run.status == "finished" and all(other.target != run.target for other in shown) and len(shown) < 8:
            shown.append(run)
    return {"eval_sets": sets, "eval_runs": runs, "eval_gate": summary.policy.promotion.eval_gate}


# ---------------------------------------------------------------- judge agreement page


def agreement_chart(report: AgreementReport) -> dict[str, Any]:
    """uPlot data: per bucket the mean Spearman rho and the pooled pairwise accuracy, each with
    its 95% bootstrap interval as dashed bounds."""

    def bound(interval: Any, side: str) -> float | None:
        return getattr(interval, side) if interval is not None else None

    figures = [b.figures for b in report.buckets]
    return {
        "x": [round(b.start.timestamp()) for b in report.buckets],
        "axis": "agreement",
        "empty": "No groups with both a judge score and a webhook reward yet.",
        "series": [
            {"label": "Spearman rho", "values": [f.spearman for f in figures]},
            {"label": "rho low", "values": [bound(f.spearman_interval, "low") for f in figures], "band": 0},
            {"label": "rho high", "values": [bound(f.spearman_interval, "high") for f in figures], "band": 0},
            {"label": "pairwise accuracy", "values": [f.pairwise_accuracy for f in figures]},
            {"label": "accuracy low", "values": [bound(f.pairwise_interval, "low") for f in figures], "band": 3},
            {"label": "accuracy high", "values": [bound(f.pairwise_interval, "high") for f in figures], "band": 3},
        ],
    }


@router.get("/policies/{policy}/agreement")
async def agreement_page(request: Request, policy: str) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    state = _state(request)
    settings = state.settings.policy(policy)
    if settings is None:
        return _error_page(request, 404, "Not found", f"policy {policy!r} is not configured")
    bucket: Bucket = "hour" if request.query_params.get("bucket") == "hour" else "day"
    report = await policy_agreement(state.engine, settings, bucket=bucket)
    context = {
        **ctx.base("overview"),
        "policy": policy,
        "settings": settings,
        "bucket": bucket,
        "report": report,
        "chart": agreement_chart(report),
    }
    return page(request, "agreement.html", context)


@router.get("/data/policies/{policy}")
async def policy_data(request: Request, policy: str) -> Response:
    if await _ctx(request) is None:
        return _unauthorized()
    state = _state(request)
    summary = await _find_policy(state, policy)
    if summary is None:
        return Response(status_code=404)
    live = await _policy_live(state, summary)
    runs_kind = _run_kind(request.query_params.get("kind"))
    runs, more_runs = await queries.runs_page(state.engine, policy, None, runs_kind)
    transitions, more_transitions = await queries.transitions_page(state.engine, policy, None)
    return json_with_etag(
        request,
        {
            "fragments": {
                "policy-live": fragment("_policy_live.html", **live),
                "runs-live": fragment("_runs.html", runs=runs, more_runs=more_runs, runs_kind=runs_kind, policy=policy),
                "transitions-live": fragment(
                    "_transitions.html", transitions=transitions, more_transitions=more_transitions, policy=policy
                ),
            },
            "charts": {"reward-chart": live["chart"]},
        },
    )


def _run_kind(value: str | None) -> str | None:
    """`?kind=rl|sft` on a policy's page: only training runs of that kind (anything else: all)."""
    return value if value in queries.RUN_KINDS else None


async def _pause(request: Request, policy: str, paused: bool) -> Response:
    checked = await _post(request)
    if isinstance(checked, Response):
        return checked
    ctx, form = checked
    if (problem := _confirmed(form)) is not None:
        return await _policy_page(request, policy, flash=problem, status_code=400)
    state = _state(request)
    # The admin API's pause takes no reason: the actor is recorded in policy_state; the reason in the log.
    _, status, message = await _guard(
        lambda: actions.set_paused(state.engine, state.settings, policy, paused, actor=ctx.session.name)
    )
    if status != 200:
        return await _policy_page(request, policy, flash=message, status_code=status)
    done = "Learning paused" if paused else "Learning resumed"
    return await _policy_page(request, policy, flash=f"{done} ({form['reason'].strip()}).")


@router.post("/policies/{policy}/pause")
async def pause(request: Request, policy: str) -> Response:
    return await _pause(request, policy, True)


@router.post("/policies/{policy}/resume")
async def resume(request: Request, policy: str) -> Response:
    return await _pause(request, policy, False)


# ---------------------------------------------------------------- version page


async def _version(state: GatewayState, ref: str) -> tuple[listing.VersionDetail | None, str]:
    detail, status, message = await _guard(lambda: queries.version_detail(state.engine, state.settings, ref))
    return detail, message


@router.get("/versions/{ref}")
async def version_page(request: Request, ref: str) -> Response:
    return await _version_page(request, ref)


async def _version_page(request: Request, ref: str, flash: str = "", status_code: int = 200) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    state = _state(request)
    detail, message = await _version(state, ref)
    if detail is None:
        return _error_page(request, 404, "Not found", message)
    summary = await _find_policy(state, detail.version.policy)
    context = {
        **ctx.base("overview"),
        "detail": detail,
        "version": detail.version,
        "paused": summary.learning_paused if summary else False,
        "flash": flash,
        "version_runs": await evalsets.runs_of(state.engine, version_id=detail.version.id),
        "set_names": {s.id: s.name for s in await evalsets.list_sets(state.engine, detail.version.policy)},
    }
    return page(request, "version.html", context, status_code)


@router.get("/data/versions/{ref}")
async def version_data(request: Request, ref: str) -> Response:
    if await _ctx(request) is None:
        return _unauthorized()
    detail, _ = await _version(_state(request), ref)
    if detail is None:
        return Response(status_code=404)
    return json_with_etag(
        request,
        {"fragments": {"version-live": fragment("_version_live.html", detail=detail, version=detail.version)}},
    )


ACTIONS = ("approve", "reject", "promote", "rollback")


@router.post("/versions/{ref}/{action}")
async def version_action(request: Request, ref: str, action: str) -> Response:
    if action not in ACTIONS:
        return _error_page(request, 404, "Not found", f"no action {action!r}")
    checked = await _post(request)
    if isinstance(checked, Response):
        return checked
    ctx, form = checked
    if (problem := _confirmed(form)) is not None:
        return await _version_page(request, ref, flash=problem, status_code=400)
    state, actor, reason = _state(request), ctx.session.name, form["reason"].strip()[:2000]
    engine, settings = state.engine, state.settings
    calls: dict[str, Callable[[], Awaitable[serving.ActionResult]]] = {
        "approve": lambda: actions.approve(engine, settings, ref, actor=actor, reason=reason),
        "reject": lambda: actions.reject(engine, settings, ref, actor=actor, reason=reason),
        "promote": lambda: actions.promote_now(
            engine, settings, ref, actor=actor, reason=reason, force=form.get("force") == "yes"
        ),
    }
    if action == "rollback":
        detail, message = await _version(state, ref)
        if detail is None:
            return _error_page(request, 404, "Not found", message)
        policy = detail.version.policy
        calls["rollback"] = lambda: actions.rollback(engine, settings, policy, ref, actor=actor, reason=reason)
    result, status, message = await _guard(calls[action])
    if status != 200:
        return await _version_page(request, ref, flash=f"{action} refused: {message}", status_code=status)
    transition = result.transition
    if transition.changed:
        flash = f"{action}: {transition.version.name} {transition.from_status} → {transition.version.status}"
        if transition.side_effects:
            flash += "; also " + ", ".join(f"{v.name} → {v.status}" for v in transition.side_effects)
    else:
        flash = f"{action}: nothing to do, {transition.version.name} is already {transition.version.status}"
    return await _version_page(request, ref, flash=flash)


# ---------------------------------------------------------------- trajectories


def _filter(request: Request, state: GatewayState) -> tuple[queries.TrajectoryFilter, dict[str, str]]:
    params = request.query_params
    raw = {name: params.get(name, "").strip() for name in ("policy", "version", "reward_min", "reward_max")}
    raw.update({name: params.get(name, "").strip() for name in ("since", "until")})
    policy = raw["policy"] or None
    settings = state.settings.policy(policy) if policy else None
    flt = queries.TrajectoryFilter(
        policy=policy,
        version=raw["version"] or None,
        reward_min=_parse_float(raw["reward_min"]),
        reward_max=_parse_float(raw["reward_max"]),
        since=_parse_time(raw["since"]),
        until=_parse_time(raw["until"]),
        reward_name=settings.learning.reward_name if settings else "reward",
    )
    return flt, raw


@router.get("/trajectories")
async def trajectories_page(request: Request) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    state = _state(request)
    flt, raw = _filter(request, state)
    after = _parse_cursor(request.query_params.get("after"))
    rows, more = await queries.trajectories_page(state.engine, flt, after)
    next_url = ""
    if more and rows:
        kept = {k: v for k, v in raw.items() if v}
        next_url = "/ui/trajectories?" + urlencode({**kept, "after": _cursor(rows[-1]["last_call_at"], rows[-1]["id"])})
    context = {
        **ctx.base("trajectories"),
        "rows": rows,
        "filter": raw,
        "next_url": next_url,
        "paged": after is not None,
        "policies": [p.name for p in state.settings.policies],
    }
    return page(request, "trajectories.html", context)


async def _trajectory(state: GatewayState, trajectory_id: str) -> dict[str, Any] | None:
    try:
        ident = uuid.UUID(trajectory_id)
    except ValueError:
        return None
    found = await get_trajectory(state.engine, [ident], None, history=True)
    if found is None:
        return None
    turns = conversation([(call.request, call.response, call.error) for call in found.calls])
    sources = await queries.reward_sources(state.engine, [r.id for r in found.rewards])
    names = await queries.version_names(state.engine, found.adapter_version_ids)
    return {"found": found, "turns": turns, "sources": sources, "version_names": names}


@router.get("/trajectories/{trajectory_id}")
async def trajectory_page(request: Request, trajectory_id: str) -> Response:
    return await _trajectory_page(request, trajectory_id)


async def _trajectory_page(request: Request, trajectory_id: str, flash: str = "", status_code: int = 200) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    state = _state(request)
    data = await _trajectory(state, trajectory_id)
    if data is None:
        return _error_page(request, 404, "Not found", f"no trajectory {trajectory_id!r}")
    policy = data["found"].trajectory.policy
    sets = await evalsets.list_sets(state.engine, policy) if policy else []
    context = {**ctx.base("trajectories"), **data, "eval_sets": sets, "flash": flash}
    return page(request, "trajectory.html", context, status_code)


@router.post("/trajectories/{trajectory_id}/eval-set")
async def add_to_eval_set(request: Request, trajectory_id: str) -> Response:
    """Pick this recorded trajectory into one of its policy's evaluation sets (docs/evaluation-sets.md)."""
    checked = await _post(request)
    if isinstance(checked, Response):
        return checked
    _, form = checked
    state = _state(request)
    data = await _trajectory(state, trajectory_id)
    if data is None:
        return _error_page(request, 404, "Not found", f"no trajectory {trajectory_id!r}")
    trajectory = data["found"].trajectory
    name = form.get("set", "")
    try:
        eval_set = await evalsets.get_set(state.engine, trajectory.policy or "", name)
    except evalsets.SetNotFound as exc:
        return await _trajectory_page(request, trajectory_id, flash=str(exc), status_code=404)
    items, missing = await evalsets.trajectory_items(state.engine, eval_set.policy, ids=[trajectory.id])
    if missing:
        return await _trajectory_page(request, trajectory_id, flash="It has no recorded conversation.", status_code=409)
    await evalsets.add_items(state.engine, eval_set.id, items)
    return await _trajectory_page(request, trajectory_id, flash=f"Added to the evaluation set {name}.")


@router.get("/data/trajectories/{trajectory_id}")
async def trajectory_data(request: Request, trajectory_id: str) -> Response:
    if await _ctx(request) is None:
        return _unauthorized()
    data = await _trajectory(_state(request), trajectory_id)
    if data is None:
        return Response(status_code=404)
    return json_with_etag(
        request,
        {
            "fragments": {
                "conversation": fragment("_conversation.html", **data),
                "trajectory-rewards": fragment("_rewards.html", **data),
            }
        },
    )


# ---------------------------------------------------------------- rewards


async def _pending(request: Request, state: GatewayState) -> dict[str, Any]:
    overdue_only = request.query_params.get("overdue") == "1"
    after = _parse_cursor(request.query_params.get("after"))
    rows, more, counts = await queries.pending_rewards(
        state.engine, window_s=state.settings.rewards.pending_window_s, overdue_only=overdue_only, after=after
    )
    next_url = ""
    if more and rows:
        query = {"after": _cursor(rows[-1]["received_at"], rows[-1]["id"])}
        if overdue_only:
            query["overdue"] = "1"
        next_url = "/ui/rewards?" + urlencode(query)
    return {
        "rows": rows,
        "counts": counts,
        "overdue_only": overdue_only,
        "next_url": next_url,
        "paged": after is not None,
        "window_s": state.settings.rewards.pending_window_s,
    }


@router.get("/rewards")
async def rewards_page(request: Request) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    return page(request, "rewards.html", {**ctx.base("rewards"), **await _pending(request, _state(request))})


@router.get("/data/rewards")
async def rewards_data(request: Request) -> Response:
    if await _ctx(request) is None:
        return _unauthorized()
    data = await _pending(request, _state(request))
    return json_with_etag(request, {"fragments": {"pending-live": fragment("_pending.html", **data)}})


@router.get("/rewards/{reward_id}")
async def reward_page(request: Request, reward_id: str) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    state = _state(request)
    try:
        ident = uuid.UUID(reward_id)
    except ValueError:
        ident = None
    reward = await get_reward(state.engine, ident, None) if ident else None
    if reward is None or ident is None:
        return _error_page(request, 404, "Not found", f"no reward {reward_id!r}")
    source = (await queries.reward_sources(state.engine, [ident])).get(ident, {})
    return page(request, "reward.html", {**ctx.base("rewards"), "reward": reward, "source": source})


# ---------------------------------------------------------------- API keys


async def _keys_page(
    request: Request, ctx: Ctx, flash: str = "", new_key: str = "", status_code: int = 200
) -> Response:
    keys = await list_keys(_state(request).engine)
    context = {**ctx.base("keys"), "keys": keys[::-1], "flash": flash, "new_key": new_key}
    return page(request, "keys.html", context, status_code)


@router.get("/keys")
async def keys_page(request: Request) -> Response:
    ctx = await _ctx(request)
    if ctx is None:
        return _to_login(request)
    return await _keys_page(request, ctx)


@router.post("/keys")
async def keys_create(request: Request) -> Response:
    checked = await _post(request)
    if isinstance(checked, Response):
        return checked
    ctx, form = checked
    name, tenant = form.get("name", "").strip(), form.get("tenant", "").strip()
    role = "admin" if form.get("role") == "admin" else "client"
    if not name or not tenant:
        return await _keys_page(request, ctx, flash="A key needs a name and a tenant.", status_code=400)
    if form.get("confirm") != "yes":
        return await _keys_page(request, ctx, flash="Tick the confirmation box to create the key.", status_code=400)
    info, key = await create_key(_state(request).engine, name=name, tenant=tenant, role=role)
    await _state(request).keys.refresh()
    return await _keys_page(request, ctx, flash=f"Created {role} key {info.name!r} for tenant {tenant!r}.", new_key=key)


@router.post("/keys/{key_id}/revoke")
async def keys_revoke(request: Request, key_id: str) -> Response:
    checked = await _post(request)
    if isinstance(checked, Response):
        return checked
    ctx, form = checked
    try:
        ident = uuid.UUID(key_id)
    except ValueError:
        return await _keys_page(request, ctx, flash=f"no key {key_id!r}", status_code=404)
    if form.get("confirm") != "yes":
        return await _keys_page(request, ctx, flash="Tick the confirmation box to revoke the key.", status_code=400)
    state = _state(request)
    count = await revoke_key(state.engine, str(ident))
    await state.keys.refresh()
    _sessions(request).forget_key(ident)
    return await _keys_page(request, ctx, flash="Key revoked." if count else "That key was already revoked.")


# ---------------------------------------------------------------- static files

_STATIC_CACHE: dict[str, tuple[bytes, str, str]] = {}


@router.get("/static/{path:path}")
async def static(request: Request, path: str) -> Response:
    """Files under gateway/ui/static (the vendored chart library with its licence included)."""
    found = _STATIC_CACHE.get(path)
    if found is None:
        target = (STATIC_DIR / path).resolve()
        if not target.is_relative_to(STATIC_DIR.resolve()) or not target.is_file():
            return Response(status_code=404, headers=SECURITY_HEADERS)
        body = target.read_bytes()
        media = mimetypes.guess_type(target.name)[0] or "text/plain"
        if media.startswith("text/") or media == "application/javascript":
            media += "; charset=utf-8"
        found = (body, media, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
        _STATIC_CACHE[path] = found
    body, media, etag = found
    headers = {"ETag": etag, "Cache-Control": "public, max-age=300", **SECURITY_HEADERS}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=media, headers=headers)
