"""Who is calling: the bearer key of a request, checked against the key cache.

One rule for every entrance (the proxy endpoints, the rewards webhook, the admin API and the
dashboard's login): open mode answers the open key; otherwise a missing, unknown or non-admin
key gets the OpenAI-style error and status a client expects, and a key store that cannot be
reached is a 503 (keys already known keep working from the cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apprentice.settings import Settings
from gateway.auth.keys import KeyCache, KeyInfo
from gateway.http.asgi import header
from gateway.http.errors import GatewayError


class Authenticator:
    def __init__(self, settings: Settings, keys: KeyCache) -> None:
        self.settings, self.keys = settings, keys
        self.open_key = KeyInfo(id=None, name="open", tenant=settings.auth.open_tenant, role="admin")

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
