"""Jinja2 templates (autoescaped) and the headers every dashboard answer carries."""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

HERE = Path(__file__).parent
TEMPLATES_DIR = HERE / "templates"
STATIC_DIR = HERE / "static"

# Scripts and styles only from static files; nothing from other origins; no framing.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}"
    return str(value)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str).decode()


def _sparkline(values: list[float], width: int = 120, height: int = 28) -> str:
    """SVG polyline points for a small trend (the template draws it; no script needed)."""
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / (len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - 2 - (v - low) / span * (height - 4):.1f}" for i, v in enumerate(values))


environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,
    undefined=jinja2.ChainableUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters["when"] = _when
environment.filters["num"] = _num
environment.filters["pretty_json"] = _json
environment.filters["sparkline"] = _sparkline


def fragment(name: str, **context: Any) -> str:
    """A template rendered to a string (a page's live part, also sent by the data endpoints)."""
    return environment.get_template(name).render(**context)


def page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    html = environment.get_template(name).render(request=request, **context)
    return HTMLResponse(html, status_code=status_code, headers={**SECURITY_HEADERS, "Cache-Control": "no-store"})


def json_with_etag(request: Request, data: dict[str, Any]) -> Response:
    """JSON with a strong ETag; an unchanged answer (If-None-Match) is an empty 304."""
    body = orjson.dumps(data, option=orjson.OPT_SORT_KEYS, default=str)
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {"ETag": etag, "Cache-Control": "no-cache", **SECURITY_HEADERS}
    wanted = request.headers.get("if-none-match", "")
    if etag in [tag.strip().removeprefix("W/") for tag in wanted.split(",")]:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)
