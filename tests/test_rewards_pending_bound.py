"""Pending rewards (their trajectory not stored) are bounded per tenant and expire, and the
answer says when."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.conftest import count_rows, wait_for
from tests.support.gateway_calls import chat, post, shipped


def test_pending_rewards_are_bounded_per_tenant_and_expire(start_gateway, db):
    gateway = start_gateway(rewards={"max_pending_per_tenant": 3, "pending_expiry_s": 3})
    answers = [post(gateway, {"client_trajectory_id": f"never-{i}", "reward": 1.0}) for i in range(3)]
    assert all(a.status_code == 200 and a.json()["status"] == "pending" for a in answers)
    first = answers[0].json()
    received = datetime.fromisoformat(first["received_at"])
    assert datetime.fromisoformat(first["expires_at"]) - received == timedelta(seconds=3)

    refused = post(gateway, {"client_trajectory_id": "never-3", "reward": 1.0})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "too_many_pending_rewards"
    batch = post(gateway, {"rewards": [{"client_trajectory_id": "never-4", "reward": 1.0}]})
    assert batch.status_code == 429
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'pending'") == 3

    # A reward whose trajectory is stored is never refused by the bound, and is not pending.
    trajectory = chat(gateway, "a stored run").headers["x-apprentice-trajectory-id"]
    shipped(db, 1)
    linked = post(gateway, {"trajectory_id": trajectory, "reward": 0.5})
    assert linked.status_code == 200 and linked.json()["status"] == "linked"
    assert linked.json()["expires_at"] is None

    wait_for(
        lambda: count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'pending'") == 0,
        timeout=20,
        message="pending rewards expired",
    )
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'linked'") == 1
    again = post(gateway, {"client_trajectory_id": "never-5", "reward": 1.0})
    assert again.status_code == 200, "room again once the old ones expired"
