"""Signed reward webhooks, on Stripe's model.

A sender that cannot hold a bearer key signs each delivery with a shared secret:

    Apprentice-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>

Several `v1=` entries may be given (one per secret while rotating). The gateway accepts the
request when one of them matches a configured secret, takes the tenant bound to that secret,
and refuses timestamps further than `rewards.tolerance_s` from its clock. A signature is
accepted once: the store keeps the signatures it has seen (table reward_signatures, written
in the same transaction as the rewards, so a delivery that failed can be retried), so a
captured request replayed to any gateway process within the window is refused with 409.
Senders re-sign every attempt (a new `t`), and use `idempotency_key` to make retries safe.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

from apprentice.settings import ConfigError, WebhookSecret, resolve_secret
from apprentice.webhook_signing import SCHEME, SIGNATURE_HEADER, compute_signature, sign
from gateway.http.errors import GatewayError

__all__ = [
    "SCHEME",
    "SIGNATURE_HEADER",
    "SignatureVerifier",
    "VerifiedSignature",
    "compute_signature",
    "parse_header",
    "sign",
]


@dataclass(frozen=True, slots=True)
class VerifiedSignature:
    tenant: str
    secret_name: str
    signature: bytes  # the matching HMAC digest: the replay key
    signed_at: float


def _invalid(message: str, code: str = "invalid_signature") -> GatewayError:
    return GatewayError(401, message, param=SIGNATURE_HEADER, code=code)


def parse_header(value: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    signatures: list[str] = []
    for part in value.split(","):
        key, _, item = part.strip().partition("=")
        if key == "t":
            try:
                timestamp = int(item)
            except ValueError:
                raise _invalid(f"{SIGNATURE_HEADER}: t must be unix seconds") from None
        elif key == SCHEME and item:
            signatures.append(item.strip().lower())
    if timestamp is None or not signatures:
        raise _invalid(f"{SIGNATURE_HEADER} must look like t=<unix seconds>,{SCHEME}=<hex hmac-sha256>")
    return timestamp, signatures


class SignatureVerifier:
    def __init__(self, secrets: list[WebhookSecret], tolerance_s: float) -> None:
        self.tolerance_s = tolerance_s
        self._secrets: list[tuple[bytes, WebhookSecret]] = []
        for entry in secrets:
            try:
                resolved = resolve_secret(entry.secret)
            except ConfigError as exc:
                raise GatewayError(
                    500, f"webhook secret {entry.name!r} is not usable: {exc}", code="webhook_secret_unavailable"
                ) from None
            if resolved:
                self._secrets.append((resolved.encode(), entry))

    def verify(self, header_value: str, body: bytes, now: float | None = None) -> VerifiedSignature:
        if not self._secrets:
            raise _invalid(
                "signed webhooks are not configured on this gateway (rewards.webhook_secrets)",
                code="webhooks_not_configured",
            )
        timestamp, candidates = parse_header(header_value)
        signed = str(timestamp).encode() + b"." + body
        for secret, entry in self._secrets:
            expected = hmac.new(secret, signed, hashlib.sha256).hexdigest()
            if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
                now = time.time() if now is None else now
                if abs(now - timestamp) > self.tolerance_s:
                    raise _invalid(
                        f"the signature's timestamp is more than {self.tolerance_s:g} s from the "
                        "gateway's clock: re-sign the request when sending it",
                        code="signature_expired",
                    )
                return VerifiedSignature(entry.tenant, entry.name, bytes.fromhex(expected), float(timestamp))
        raise _invalid("no signature in the header matches a configured secret for this body")
