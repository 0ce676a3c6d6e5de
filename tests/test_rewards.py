"""POST /v1/rewards against a real gateway process and PostgreSQL: targets, idempotency,
latest-wins, pending rewards, merges, tenants and bad input."""

from __future__ import annotations

import json
import time
from datetime import datetime

import httpx
import psycopg

from gateway.store.rewards import MERGE_STATEMENTS
from tests.conftest import count_rows, wait_for
from tests.support.gateway_calls import chat, post, shipped

POLICY = "grader-agent"


def rewards_rows(db) -> list[tuple]:
    return db.execute(
        "SELECT trajectory_id::text, name, value, status, superseded_at IS NULL, idempotency_key "
        "FROM rewards ORDER BY seq"
    ).fetchall()


def test_idempotency_history_and_latest_wins(start_gateway, db):
    gateway = start_gateway()
    trajectory = chat(gateway, "one task").headers["x-apprentice-trajectory-id"]
    shipped(db, 1)
    body = {"trajectory_id": trajectory, "reward": 0.5, "idempotency_key": "ticket-1"}
    first = post(gateway, body)
    again = post(gateway, body)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json(), "the same id and content answers the same"
    assert again.headers.get("idempotent-replayed") == "true" and "idempotent-replayed" not in first.headers
    via_header = post(gateway, {"trajectory_id": trajectory, "reward": 0.5}, headers={"Idempotency-Key": "ticket-1"})
    assert via_header.json()["id"] == first.json()["id"]
    assert count_rows(db, "SELECT count(*) FROM rewards") == 1

    replaced = post(gateway, {**body, "reward": 0.9})
    assert replaced.json()["current"] is True and replaced.json()["id"] != first.json()["id"]
    assert post(gateway, body).json()["current"] is False, "replaying the old content changes nothing"
    assert [(r[2], r[4]) for r in rewards_rows(db)] == [(0.5, False), (0.9, True)]

    # Without an id: one current reward per trajectory and name; the latest observation wins,
    # whatever the arrival order, and every row is kept.
    now = time.time()
    post(gateway, {"trajectory_id": trajectory, "name": "csat", "reward": 3, "timestamp": now + 20})
    late_old = post(gateway, {"trajectory_id": trajectory, "name": "csat", "reward": 1, "timestamp": now + 10})
    assert late_old.json()["current"] is False
    current = db.execute(
        "SELECT name, value FROM rewards WHERE superseded_at IS NULL AND status = 'linked' ORDER BY name"
    ).fetchall()
    assert current == [("csat", 3.0), ("reward", 0.9)]
    newest = post(gateway, {"trajectory_id": trajectory, "reward": 0.1, "timestamp": "2099-01-01T00:00:00Z"})
    assert newest.json()["current"] is True
    assert count_rows(db, "SELECT count(*) FROM rewards") == 5
    history = httpx.get(gateway.base_url + f"/trajectories/{trajectory}", params={"history": "true"}).json()
    assert len(history["rewards"]) == 5
    assert [
        r["reward"]
        for r in httpx.get(gateway.base_url + f"/trajectories/{trajectory}").json()["rewards"]
        if r["name"] == "reward"
    ] == [0.1]

    # A batch: stored together; the Idempotency-Key header names each item <key>:<index>.
    batch = {"rewards": [{"trajectory_id": trajectory, "name": f"m{i}", "reward": i} for i in range(3)]}
    stored = post(gateway, batch, headers={"Idempotency-Key": "batch-7"})
    assert stored.json()["object"] == "list" and len(stored.json()["data"]) == 3
    assert post(gateway, batch, headers={"Idempotency-Key": "batch-7"}).json() == stored.json()
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE idempotency_key LIKE 'batch-7:%%'") == 3


def test_reward_before_its_trajectory_links_when_it_lands(start_gateway, db, database_url):
    # Pending rewards older than the window are retried once a minute only (the overdue pass): the
    # window must outlast this test's linking on a loaded machine (it was 1 s, and the test failed
    # when the calls landed more than a second after the rewards).
    window_s = 8.0
    gateway = start_gateway(rewards={"pending_window_s": window_s})
    early = post(
        gateway, {"client_trajectory_id": "not-run-yet", "reward": 1, "group_id": "g-early", "idempotency_key": "early"}
    )
    assert early.json()["status"] == "pending" and early.json()["trajectory_id"] is None
    never = post(gateway, {"call_id": "chatcmpl-never-seen", "reward": 0.3})
    assert never.json()["status"] == "pending"

    # Hold the shipper back: the calls are answered (ids known to the client) but not stored.
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE calls IN EXCLUSIVE MODE")
        run = chat(gateway, "the early run", client_id="not-run-yet")
        other = chat(gateway, "another run")
        by_call = post(gateway, {"call_id": other.json()["id"], "reward": 0.5})
        by_trajectory = post(
            gateway, {"trajectory_id": other.headers["x-apprentice-trajectory-id"], "reward": 0.7, "name": "speed"}
        )
        assert by_call.json()["status"] == by_trajectory.json()["status"] == "pending"
        assert count_rows(blocker, "SELECT count(*) FROM calls") == 0
        blocker.rollback()

    wait_for(
        lambda: count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'pending'") == 1,
        message="pending rewards linked",
    )
    linked = dict(
        db.execute(
            "SELECT idempotency_key, trajectory_id::text FROM rewards WHERE status = 'linked' "
            "AND idempotency_key IS NOT NULL"
        ).fetchall()
    )
    assert linked == {"early": run.headers["x-apprentice-trajectory-id"]}
    assert (
        count_rows(
            db,
            "SELECT count(*) FROM rewards WHERE trajectory_id = %s AND superseded_at IS NULL",
            other.headers["x-apprentice-trajectory-id"],
        )
        == 2
    )
    group = db.execute(
        "SELECT group_id FROM trajectories WHERE id = %s", (run.headers["x-apprentice-trajectory-id"],)
    ).fetchone()
    assert group == ("g-early",), "a reward's group_id is applied when it links"
    assert httpx.get(gateway.base_url + f"/rewards/{early.json()['id']}").json()["status"] == "linked"

    # The one that never finds its trajectory stays, and is reported once overdue.
    received = datetime.fromisoformat(never.json()["received_at"]).timestamp()
    time.sleep(max(0.0, received + window_s + 0.2 - time.time()))
    report = httpx.get(gateway.base_url + "/rewards/pending", params={"overdue_only": "true"}).json()
    assert [r["target"] for r in report["data"]] == ["chatcmpl-never-seen"]
    assert report["data"][0]["overdue"] is True and report["overdue_count"] == 1 and report["pending_count"] == 1


def test_rewards_follow_a_merged_trajectory(start_gateway, db):
    gateway = start_gateway()
    parent = chat(gateway, "parent part").headers["x-apprentice-trajectory-id"]
    child = chat(gateway, "child part").headers["x-apprentice-trajectory-id"]
    shipped(db, 2)
    post(gateway, {"trajectory_id": parent, "reward": 0.2, "timestamp": 100})
    post(gateway, {"trajectory_id": child, "reward": 0.8, "timestamp": 200})
    post(gateway, {"trajectory_id": child, "reward": 5, "name": "steps"})
    with db.transaction():  # what the stitcher does when it finds child continues parent
        db.execute("CREATE TEMP TABLE merges (child uuid, parent uuid) ON COMMIT DROP")
        db.execute("INSERT INTO merges VALUES (%s, %s)", (child, parent))
        db.execute("UPDATE calls SET trajectory_id = m.parent FROM merges m WHERE calls.trajectory_id = m.child")
        db.execute("UPDATE trajectories t SET merged_into = m.parent FROM merges m WHERE t.id = m.child")
        for statement in MERGE_STATEMENTS:
            db.execute(statement)
    current = db.execute(
        "SELECT trajectory_id::text, name, value FROM rewards WHERE superseded_at IS NULL ORDER BY name"
    ).fetchall()
    assert current == [(parent, "reward", 0.8), (parent, "steps", 5.0)]
    late = post(gateway, {"trajectory_id": child, "reward": 0.1, "timestamp": 50})
    assert late.json()["trajectory_id"] == parent and late.json()["current"] is False
    merged = httpx.get(gateway.base_url + f"/trajectories/{child}").json()
    assert merged["id"] == parent and merged["aliases"] == [child] and len(merged["calls"]) == 2


def test_a_key_rewards_only_its_own_tenant(start_gateway, db, database_url, tmp_path):
    import asyncio

    from apprentice.store.engine import make_async_engine
    from gateway.auth.keys import create_key

    async def keys() -> tuple[str, str]:
        engine = make_async_engine(database_url)
        try:
            return (await create_key(engine, name="a", tenant="acme"))[1], (
                await create_key(engine, name="b", tenant="globex")
            )[1]
        finally:
            await engine.dispose()

    acme, globex = asyncio.run(keys())
    gateway = start_gateway(auth={"mode": "keys", "admin_key": "admin-secret-key-123456"})
    response = chat(gateway, "acme's run", key=acme)
    trajectory = response.headers["x-apprentice-trajectory-id"]
    shipped(db, 1)
    assert post(gateway, {"trajectory_id": trajectory, "reward": 1}, key="wrong").status_code == 401
    foreign = post(gateway, {"trajectory_id": trajectory, "reward": 1}, key=globex)
    assert foreign.json()["status"] == "pending", "another tenant's trajectory is unknown to this key"
    foreign_call = post(gateway, {"call_id": response.json()["id"], "reward": 1}, key=globex)
    assert foreign_call.json()["status"] == "pending"
    assert (
        httpx.get(
            gateway.base_url + f"/trajectories/{trajectory}", headers={"Authorization": f"Bearer {globex}"}
        ).status_code
        == 404
    )
    own = post(gateway, {"trajectory_id": trajectory, "reward": 1}, key=acme)
    assert own.json()["status"] == "linked"
    time.sleep(0.3)
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE trajectory_id IS NOT NULL") == 1
    assert httpx.get(gateway.base_url + "/trajectories", headers={"Authorization": f"Bearer {acme}"}).status_code == 403
    admin = {"Authorization": "Bearer admin-secret-key-123456"}
    assert len(httpx.get(gateway.base_url + "/trajectories", headers=admin).json()["data"]) == 1
    assert httpx.get(gateway.base_url + "/rewards/pending", headers=admin).json()["pending_count"] == 2


BAD_INPUTS = [
    # (name, raw body, expected status, expected param, code)
    ("nan literal", '{"trajectory_id": "%(t)s", "reward": NaN}', 400, "reward", "invalid_value"),
    ("infinity", '{"trajectory_id": "%(t)s", "reward": Infinity}', 400, "reward", "invalid_value"),
    ("minus infinity", '{"trajectory_id": "%(t)s", "reward": -Infinity}', 400, "reward", "invalid_value"),
    ("overflow", '{"trajectory_id": "%(t)s", "reward": 1e999}', 400, "reward", "invalid_value"),
    ("numeric string", '{"trajectory_id": "%(t)s", "reward": "1.0"}', 400, "reward", "invalid_value"),
    ("boolean", '{"trajectory_id": "%(t)s", "reward": true}', 400, "reward", "invalid_value"),
    ("missing reward", '{"trajectory_id": "%(t)s"}', 400, "reward", "invalid_value"),
    (
        "metric nan",
        '{"trajectory_id": "%(t)s", "reward": 0.5, "metrics": {"tests": NaN}}',
        400,
        "metrics.tests",
        "invalid_value",
    ),
    (
        "metric string",
        '{"trajectory_id": "%(t)s", "reward": 0.5, "metrics": {"tests": "3"}}',
        400,
        "metrics.tests",
        "invalid_value",
    ),
    ("above range", '{"trajectory_id": "%(t)s", "reward": 1.5}', 400, "reward", "reward_out_of_range"),
    ("below range", '{"trajectory_id": "%(t)s", "reward": -2}', 400, "reward", "reward_out_of_range"),
    (
        "unknown metric",
        '{"trajectory_id": "%(t)s", "reward": 0.5, "metrics": {"vibes": 1}}',
        400,
        "metrics.vibes",
        "unknown_metric",
    ),
    ("unknown name", '{"trajectory_id": "%(t)s", "reward": 0.5, "name": "vibes"}', 400, "name", "unknown_metric"),
    ("no target", '{"reward": 0.5}', 400, "trajectory_id", "invalid_value"),
    (
        "two targets",
        '{"trajectory_id": "%(t)s", "call_id": "chatcmpl-1", "reward": 0.5}',
        400,
        "trajectory_id",
        "invalid_value",
    ),
    ("unknown field", '{"trajectory_id": "%(t)s", "reward": 0.5, "value": 1}', 400, "value", "invalid_value"),
    ("not json", '{"trajectory_id": ', 400, None, "invalid_json"),
    ("not an object", "[1, 2]", 400, None, "invalid_json"),
    (
        "batch item",
        '{"rewards": [{"trajectory_id": "%(t)s", "reward": 0.5}, {"trajectory_id": "%(t)s", "reward": 0},'
        ' {"trajectory_id": "%(t)s", "reward": 9}]}',
        400,
        "rewards[2].reward",
        "reward_out_of_range",
    ),
    (
        "batch nan",
        '{"rewards": [{"trajectory_id": "%(t)s", "reward": 0.5}, {"call_id": "c", "reward": NaN}]}',
        400,
        "rewards[1].reward",
        "invalid_value",
    ),
    ("empty batch", '{"rewards": []}', 400, "rewards", "invalid_value"),
    (
        "oversized batch",
        json.dumps({"rewards": [{"call_id": f"c{i}", "reward": 0} for i in range(6)]}),
        413,
        "rewards",
        "batch_too_large",
    ),
]


def test_bad_input_is_refused_and_nothing_is_stored(start_gateway, fake_upstream, db):
    policy = {
        "name": POLICY,
        "base_model": "fake-base",
        "endpoints": [fake_upstream.api_base],
        "reward_range": [-1.0, 1.0],
        "metrics": ["tests", "latency"],
    }
    gateway = start_gateway(policies=[policy], rewards={"max_batch": 5})
    trajectory = chat(gateway, "graded run", model=POLICY).headers["x-apprentice-trajectory-id"]
    shipped(db, 1)
    failures = []
    for name, raw, status, param, code in BAD_INPUTS:
        response = post(gateway, raw.replace("%(t)s", trajectory) if "%(t)s" in raw else raw)
        error = response.json().get("error", {})
        if (response.status_code, error.get("param"), error.get("code")) != (status, param, code):
            failures.append((name, response.status_code, response.text))
        elif error.get("type") != "invalid_request_error" or not error.get("message"):
            failures.append((name, "not OpenAI's error format", response.text))
    assert not failures, failures
    assert count_rows(db, "SELECT count(*) FROM rewards") == 0

    # A pending reward cannot be checked against a policy until it links: refused then, and reported.
    pending = post(gateway, {"client_trajectory_id": "later", "reward": 7, "metrics": {"tests": 1}})
    assert pending.json()["status"] == "pending"
    chat(gateway, "later run", client_id="later", model=POLICY)
    row = wait_for(lambda: db.execute("SELECT status, reject_reason FROM rewards WHERE status <> 'pending'").fetchone())
    assert row[0] == "rejected" and "reward_range" in row[1]
    report = httpx.get(gateway.base_url + "/rewards/pending", params={"status": "rejected"}).json()
    assert report["rejected_count"] == 1 and report["data"][0]["status"] == "rejected"
    good = post(gateway, {"trajectory_id": trajectory, "reward": 1.0, "metrics": {"tests": 2, "latency": 0.3}})
    assert good.status_code == 200 and good.json()["current"] is True
