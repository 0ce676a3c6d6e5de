"""GET /v1/models, /healthz, /readyz and /metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import text

from gateway import metrics
from gateway.http.documented import CLIENT
from gateway.http.errors import GatewayError
from gateway.state import GatewayState

router = APIRouter()

# /readyz fails when this much is waiting in the journal: the store is too far behind.
READY_BACKLOG_LIMIT_BYTES = 512 * 1024 * 1024


def _state(request: Request) -> GatewayState:
    return request.app.state.gateway


@router.get("/v1/models", tags=["openai"], dependencies=[CLIENT])
async def list_models(request: Request) -> Response:
    state = _state(request)
    try:
        await state.authenticate(request.scope)
    except GatewayError as error:
        return Response(error.body(), status_code=error.status, media_type="application/json")
    policies = {policy.name for policy in state.settings.policies}
    data = [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "apprentice-policy" if name in policies else "apprentice",
        }
        for name in state.router.model_names
    ]
    return JSONResponse({"object": "list", "data": data})


@router.get("/healthz", tags=["operations"])
async def healthz() -> dict[str, str]:
    """The process is up (liveness)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["operations"],
    responses={
        503: {
            "description": "Not ready: the store does not answer, or the journal backlog is too large (the same body).",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
)
async def readyz(request: Request) -> Response:
    """Ready when the store answers and the journal backlog is bounded.

    Background workers are reported (`checks.workers`; `status` "degraded" and their names in
    `failing_workers` when one keeps failing) but do not make the gateway unready: calls are
    still served and journaled, and taking every replica out of rotation for a failure they
    all share (the store, a bad row) would turn a degraded service into an outage. A store
    outage already fails the `store` check, and a shipper that cannot keep up fails `journal`.
    """
    state = _state(request)
    checks: dict[str, object] = {}
    ready = True
    started = time.perf_counter()
    try:
        async with state.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
        checks["store"] = {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 2)}
    except Exception as exc:
        ready = False
        checks["store"] = {"ok": False, "error": f"{type(exc).__name__}"}
    backlog = state.shipper.backlog_bytes()
    metrics.JOURNAL_BACKLOG.set(backlog)
    checks["journal"] = {
        "ok": backlog < READY_BACKLOG_LIMIT_BYTES,
        "backlog_bytes": backlog,
        "shipped_rows": state.shipper.stats.shipped_rows,
        "last_error": state.shipper.stats.last_error,
    }
    ready = ready and backlog < READY_BACKLOG_LIMIT_BYTES
    now = time.time()
    checks["workers"] = {worker.name: worker.health.report(now) for worker in state.workers}
    failing = [worker.name for worker in state.workers if worker.health.failing]
    status = "not ready" if not ready else "degraded" if failing else "ready"
    return JSONResponse(
        {"status": status, "checks": checks, "failing_workers": failing}, status_code=200 if ready else 503
    )


@router.get(
    "/metrics",
    tags=["operations"],
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus' text exposition format.", "content": {"text/plain": {}}}},
)
async def prometheus_metrics(request: Request) -> Response:
    _state(request).shipper.stats.backlog_bytes = _state(request).shipper.backlog_bytes()
    metrics.JOURNAL_BACKLOG.set(_state(request).shipper.stats.backlog_bytes)
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)
