"""Cross-site request forgery: every dashboard POST must carry the session's token and, when
the browser says where it comes from, come from this origin.

- The token (`csrf_token`, a hidden field in every form) is an HMAC of the session's random
  nonce with the installation's secret: another site cannot read it (the page is same-origin
  and the cookie is HttpOnly, SameSite=Strict), and it changes with every login.
- The login form, which has no session yet, carries a token derived from a short-lived login
  cookie (double submit), so another site cannot log a browser in under its own key.
- `Origin` (or, without it, `Referer`) must name this host when present; a request with
  neither (a non-browser client) relies on the token alone.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.requests import Request

FIELD = "csrf_token"


def same_origin(request: Request) -> bool:
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        return urlsplit(origin).netloc == host
    if origin == "null":
        return False
    referer = request.headers.get("referer")
    if referer is not None:
        return urlsplit(referer).netloc == host
    return True


def token_matches(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
