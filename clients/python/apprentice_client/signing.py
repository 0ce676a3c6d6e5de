"""Signed reward webhooks: the header the gateway verifies (gateway/rewards/signatures.py).

    Apprentice-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>

Stripe's scheme. Sign the exact bytes you send, and sign every attempt anew: the gateway
refuses a signature it has accepted before (409) and one whose `t` is too far from its clock.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Apprentice-Signature"


def signature(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The `Apprentice-Signature` header value for `body`, signed now (or at `timestamp`)."""
    key = secret.encode() if isinstance(secret, str) else secret
    t = int(time.time()) if timestamp is None else int(timestamp)
    digest = hmac.new(key, str(t).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"
