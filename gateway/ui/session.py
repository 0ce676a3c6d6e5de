"""Dashboard sessions: log in with an admin key, then a signed, expiring cookie.

The key is checked exactly as the admin API checks it (`GatewayState.authenticate` with
`admin=True`: the configured admin key or a key with role admin; anything in open mode). The
cookie holds no key: `payload.signature`, where the payload (base64url JSON) names the key
(its id, or none for the configured admin key), a fingerprint of the key, a random nonce (the
CSRF token derives from it) and the expiry, and the signature is an HMAC-SHA256 with a
per-installation secret (`instance_secrets` row `ui_sessions`, shared by every gateway
process). A session ends at its expiry, at logout, when its key is revoked, or when the
configured admin key changes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import select
from starlette.requests import Request
from starlette.responses import Response

from apprentice.settings import resolve_secret
from apprentice.store.secrets import instance_secret
from apprentice.store.tables import api_keys
from gateway.auth.keys import KeyInfo, hash_key
from gateway.http.errors import GatewayError
from gateway.state import GatewayState

SECRET_NAME = "ui_sessions"
SESSION_COOKIE = "apprentice_ui"
LOGIN_COOKIE = "apprentice_ui_login"
COOKIE_PATH = "/ui"
SESSION_TTL_S = 12 * 3600
LOGIN_TTL_S = 3600
# How long a database key's "still active" check is trusted (revocations reach sessions within it).
KEY_CHECK_TTL_S = 5.0


@dataclass(frozen=True)
class Session:
    key_id: uuid.UUID | None  # None: the configured admin key (or open mode)
    name: str  # the key's name: the actor of every action taken in the session
    fingerprint: str
    nonce: str
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    """Issues and checks session cookies for one gateway process."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self._secret: bytes | None = None
        self._key_checks: dict[uuid.UUID, tuple[bool, float]] = {}

    async def secret(self) -> bytes:
        if self._secret is None:
            self._secret = await instance_secret(self.state.engine, SECRET_NAME)
        return self._secret

    def _mac(self, secret: bytes, purpose: bytes, data: bytes) -> str:
        return _b64(hmac.new(secret, purpose + b"\x00" + data, hashlib.sha256).digest())

    def _fingerprint(self, secret: bytes, key_hash: bytes) -> str:
        return self._mac(secret, b"key", key_hash)[:22]

    # ---- login ---------------------------------------------------------------------------
    async def check_key(self, key: str) -> KeyInfo:
        """The admin key's info, or a GatewayError (401 wrong key, 403 not admin, 503 store down)."""
        if not key.strip():
            raise GatewayError(401, "Enter an admin key.", code="missing_api_key")
        try:
            encoded = key.strip().encode("latin-1")
        except UnicodeEncodeError:
            raise GatewayError(401, "That is not a valid API key.", code="invalid_api_key") from None
        scope = {"type": "http", "headers": [(b"authorization", b"Bearer " + encoded)]}
        return await self.state.authenticate(scope, admin=True)

    async def issue(self, info: KeyInfo, key: str) -> str:
        secret = await self.secret()
        payload = {
            "i": str(info.id) if info.id else None,
            "n": info.name,
            "f": self._fingerprint(secret, hash_key(key.strip())),
            "s": secrets.token_urlsafe(16),
            "e": int(time.time()) + SESSION_TTL_S,
        }
        body = _b64(orjson.dumps(payload))
        return body + "." + self._mac(secret, b"session", body.encode())

    # ---- every request -------------------------------------------------------------------
    async def read(self, request: Request) -> Session | None:
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie or "." not in cookie:
            return None
        body, signature = cookie.rsplit(".", 1)
        secret = await self.secret()
        if not hmac.compare_digest(signature, self._mac(secret, b"session", body.encode())):
            return None
        try:
            payload: dict[str, Any] = orjson.loads(_unb64(body))
            session = Session(
                key_id=uuid.UUID(payload["i"]) if payload["i"] else None,
                name=str(payload["n"]),
                fingerprint=str(payload["f"]),
                nonce=str(payload["s"]),
                expires=int(payload["e"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        if session.expires < time.time():
            return None
        if not await self._key_active(session, secret):
            return None
        return session

    async def _key_active(self, session: Session, secret: bytes) -> bool:
        auth = self.state.settings.auth
        if session.key_id is None:
            if auth.mode == "open":
                return True
            admin_key = resolve_secret(auth.admin_key)
            return admin_key is not None and hmac.compare_digest(
                session.fingerprint, self._fingerprint(secret, hash_key(admin_key))
            )
        checked = self._key_checks.get(session.key_id)
        now = time.monotonic()
        if checked is not None and now - checked[1] < KEY_CHECK_TTL_S:
            return checked[0]
        async with self.state.engine.connect() as connection:
            row = (
                await connection.execute(
                    select(api_keys.c.key_hash).where(
                        api_keys.c.id == session.key_id, api_keys.c.revoked_at.is_(None), api_keys.c.role == "admin"
                    )
                )
            ).first()
        active = row is not None and hmac.compare_digest(session.fingerprint, self._fingerprint(secret, row.key_hash))
        if len(self._key_checks) > 1000:
            self._key_checks.clear()
        self._key_checks[session.key_id] = (active, now)
        return active

    def forget_key(self, key_id: uuid.UUID) -> None:
        """A key was revoked here: its sessions end now on this process."""
        self._key_checks.pop(key_id, None)

    # ---- CSRF tokens -----------------------------------------------------------------------
    async def csrf_token(self, session: Session) -> str:
        return self._mac(await self.secret(), b"csrf", session.nonce.encode())

    async def login_token(self, nonce: str) -> str:
        return self._mac(await self.secret(), b"login", nonce.encode())


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(
        name, path=COOKIE_PATH, httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
