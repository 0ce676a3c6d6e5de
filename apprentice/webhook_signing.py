"""The Apprentice-Signature scheme (Stripe's model), shared by both directions.

    Apprentice-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>

A reward webhook's sender signs with it and the gateway verifies (gateway/rewards/signatures.py);
the evaluation sets sign their calls of an operator's reward function with it
(apprentice/evalsets/scoring.py), so the operator verifies them with the code they already have.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Apprentice-Signature"
SCHEME = "v1"

__all__ = ["SCHEME", "SIGNATURE_HEADER", "compute_signature", "sign"]


def compute_signature(secret: str | bytes, timestamp: int, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The header value for `body` (what a sender computes)."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return f"t={timestamp},{SCHEME}={compute_signature(secret, timestamp, body)}"
