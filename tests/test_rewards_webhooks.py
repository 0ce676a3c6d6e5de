"""Signed reward webhooks: HMAC-SHA256 over "<t>.<body>", a tolerance window, replays refused
by every gateway process sharing the store."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from apprentice.store.engine import make_async_engine
from gateway.auth.keys import create_key
from gateway.rewards.signatures import sign
from tests.conftest import count_rows, wait_for

SECRET = "whsec_test_3c9f0a7d1e2b4c5d"
OTHER_SECRET = "whsec_other_tenant_88aa"


def make_key(database_url: str, tenant: str) -> str:
    async def run() -> str:
        engine = make_async_engine(database_url)
        try:
            return (await create_key(engine, name=tenant, tenant=tenant))[1]
        finally:
            await engine.dispose()

    return asyncio.run(run())


def send(gateway, body: bytes, signature: str | None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers["Apprentice-Signature"] = signature
    return httpx.post(gateway.base_url + "/rewards", content=body, headers=headers, timeout=30)


def test_signed_webhooks(start_gateway, database_url, db, tmp_path):
    key = make_key(database_url, "acme")
    config = {
        "auth": {"mode": "keys"},
        "rewards": {
            "tolerance_s": 300,
            "webhook_secrets": [
                {"name": "crm", "secret": "os.environ/CRM_HOOK_SECRET", "tenant": "acme"},
                {"name": "other", "secret": OTHER_SECRET, "tenant": "globex"},
            ],
        },
    }
    gateway = start_gateway(env={"CRM_HOOK_SECRET": SECRET}, **config)
    second = start_gateway(env={"CRM_HOOK_SECRET": SECRET}, data_dir=tmp_path / "second", **config)
    call = httpx.post(
        gateway.base_url + "/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "fake-model", "messages": [{"role": "user", "content": "ticket 4711"}]},
    ).json()
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 1)

    body = json.dumps({"call_id": call["id"], "reward": 1.0, "idempotency_key": "ticket-4711"}).encode()
    unsigned = send(gateway, body, None)
    assert unsigned.status_code == 401 and unsigned.json()["error"]["code"] == "missing_api_key"

    good = send(gateway, body, sign(SECRET, body))
    assert good.status_code == 200, good.text
    assert good.json()["status"] == "linked"
    assert db.execute("SELECT tenant, source FROM rewards").fetchall() == [("acme", "webhook:crm")]

    # A minute past the 300 s tolerance either way: `int(time.time())` truncates, so a stamp only
    # one second past it is back inside once the gateway's clock reaches the next whole second.
    outside = 300 + 60
    refusals = {
        "wrong secret": (send(gateway, body, sign("whsec_wrong", body)), 401, "invalid_signature"),
        "tampered body": (send(gateway, body.replace(b"1.0", b"0.0"), sign(SECRET, body)), 401, "invalid_signature"),
        "stale": (send(gateway, body, sign(SECRET, body, int(time.time()) - outside)), 401, "signature_expired"),
        "from the future": (
            send(gateway, body, sign(SECRET, body, int(time.time()) + outside)),
            401,
            "signature_expired",
        ),
        "malformed": (send(gateway, body, "v1=abc"), 401, "invalid_signature"),
    }
    stamped = sign(SECRET, body, int(time.time()) + 1)  # a new timestamp: a new signature
    first = send(gateway, body, stamped)  # re-signed retry of the same delivery: idempotent
    assert first.status_code == 200 and first.headers.get("idempotent-replayed") == "true"
    assert first.json() == good.json()
    refusals["replayed"] = (send(gateway, body, stamped), 409, "signature_replayed")
    refusals["replayed to another process"] = (send(second, body, stamped), 409, "signature_replayed")
    for name, (response, status, code) in refusals.items():
        error = response.json()["error"]
        assert (response.status_code, error["code"]) == (status, code), (name, response.text)
        assert error["param"] == "Apprentice-Signature", name
    assert count_rows(db, "SELECT count(*) FROM rewards") == 1

    t = int(time.time()) + 2
    rotated = f"t={t},v1={'0' * 64},v1={sign(SECRET, body, t).split('v1=')[1]}"
    assert send(second, body, rotated).status_code == 200, "any v1 entry may match (secret rotation)"
    changed = json.dumps({"call_id": call["id"], "reward": 0.0, "idempotency_key": "ticket-4711"}).encode()
    assert send(second, changed, sign(SECRET, changed)).json()["current"] is True
    assert db.execute("SELECT value, superseded_at IS NULL FROM rewards ORDER BY seq").fetchall() == [
        (1.0, False),
        (0.0, True),
    ]

    # A secret is bound to its tenant: globex's secret cannot reach acme's trajectory.
    foreign = json.dumps({"call_id": call["id"], "reward": 1.0}).encode()
    assert send(gateway, foreign, sign(OTHER_SECRET, foreign)).json()["status"] == "pending"
    bad = json.dumps({"call_id": call["id"], "reward": "1"}).encode()
    invalid = send(gateway, bad, sign(SECRET, bad))
    assert invalid.status_code == 400 and invalid.json()["error"]["param"] == "reward"
    assert count_rows(db, "SELECT count(*) FROM reward_signatures") == 5, "a refused body does not use up its signature"
