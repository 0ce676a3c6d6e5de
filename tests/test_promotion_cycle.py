"""The full promotion cycle against real processes: the local inference server (a tiny random
model with real PEFT adapters), two gateway processes and PostgreSQL.

The test process plays the learner: it records training runs and candidate versions the way
the learner does and runs `promotion_tick`, the periodic job. Operators act through the
admin API. Background load runs through both gateways during every switch: no call may
fail, and every call a client saw must be recorded with the version that served it.
"""

from __future__ import annotations

import random
from datetime import timedelta

import httpx
import pytest

from tests.conftest import wait_for
from tests.support.promotion import (
    BackgroundLoad,
    add_candidate,
    admin,
    canary_round,
    policy_config,
    routes_to,
    serves_canary,
    start_gateways,
    status_of,
    tick,
)

# Two gateways and the tiny model server through every switch (make test-fast skips it).
pytestmark = pytest.mark.slow


def test_full_cycle(start_gateway, local_server, tiny, db, database_url, tmp_path):
    rng = random.Random(11)
    # A grace far longer than the test's steps take on a loaded machine: versions that stopped
    # serving stay loaded until the last tick, which is past it by the database's clock.
    grace_s = 300
    policy = policy_config("agent", local_server, unload_grace_s=grace_s)
    gateways = start_gateways(start_gateway, tmp_path, policy, count=2)

    # v1: an admin promotes it at once (loaded at the endpoint first, then serving).
    v1 = add_candidate(db, "agent", 1, tiny.adapters[1])
    answer = admin(gateways[0], "POST", "/versions/agent-v1/promote", {"reason": "first adapter"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["endpoints"] == [{"endpoint": local_server.api_base, "action": "loaded", "attempts": 1}]
    assert admin(gateways[1], "POST", f"/versions/{v1}/promote").json()["changed"] is False  # idempotent
    assert "agent-v1" in local_server.models()
    routes_to(gateways, "agent", "agent-v1")

    with BackgroundLoad(gateways, "agent") as load:
        # The learner finishes a run: v2 becomes the canary at half the new trajectories.
        v2 = add_candidate(db, "agent", 2, tiny.adapters[2])
        report = tick(database_url, policy)
        assert ("agent-v2", "canary") in {(a["version"], a["action"]) for a in report.actions}
        assert "agent-v2" in local_server.models()
        serves_canary(gateways, "agent", "agent-v2")
        runs = canary_round(db, gateways, "agent", ("agent-v2", "agent-v1"), 0.9, 0.2, rng)
        share = sum(r.served[0] == "agent-v2" for r in runs) / len(runs)
        assert 0.2 <= share <= 0.8, f"canary share {share:.2f} of {len(runs)} runs, configured 0.5"
        policies = admin(gateways[1], "GET", "/policies").json()["data"]
        assert policies[0]["promoted"]["name"] == "agent-v1" and policies[0]["canary"]["name"] == "agent-v2"

        # The canary wins: promoted by the job; both gateways move to it.
        report = tick(database_url, policy)
        assert status_of(db, v2) == "promoted" and status_of(db, v1) == "retired", report.actions
        routes_to(gateways, "agent", "agent-v2")

        # An operator rolls back: v1 serves again everywhere.
        back = admin(gateways[1], "POST", "/policies/agent/rollback", {"version": 1, "reason": "drill"})
        assert back.status_code == 200, back.text
        assert back.json()["changed"] and [v["name"] for v in back.json()["retired"]] == ["agent-v2"]
        routes_to(gateways, "agent", "agent-v1")

        # A regressed candidate reaches the canary, loses, and is rejected by the job.
        v3 = add_candidate(db, "agent", 3, tiny.adapters[3])
        tick(database_url, policy)
        assert status_of(db, v3) == "canary"
        serves_canary(gateways, "agent", "agent-v3")
        canary_round(db, gateways, "agent", ("agent-v3", "agent-v1"), 0.1, 0.7, rng)
        # meanwhile a run that diverged (NaN loss) produced v4: it never serves.
        v4 = add_candidate(db, "agent", 4, tiny.adapters[2], loss=float("nan"))
        report = tick(database_url, policy)
        assert status_of(db, v3) == "rejected" and status_of(db, v4) == "rejected", report.actions
        assert status_of(db, v1) == "promoted"
        routes_to(gateways, "agent", "agent-v1")
        assert len(load.seen) > 20

    assert load.failures == [], load.failures[:5]
    assert "agent-v4" not in local_server.models()
    transitions = db.execute(
        "SELECT v.name, t.to_status, t.actor FROM adapter_transitions t JOIN adapter_versions v "
        "ON v.id = t.adapter_version_id ORDER BY t.id"
    ).fetchall()
    assert transitions == [
        ("agent-v1", "promoted", "admin"),
        ("agent-v2", "canary", "auto"),
        ("agent-v1", "retired", "auto"),
        ("agent-v2", "promoted", "auto"),
        ("agent-v2", "retired", "admin"),
        ("agent-v1", "promoted", "admin"),
        ("agent-v3", "canary", "auto"),
        ("agent-v4", "rejected", "auto"),
        ("agent-v3", "rejected", "auto"),
    ]

    # Every call a client saw is recorded, naming the version that served it.
    names = dict(db.execute("SELECT id::text, name FROM adapter_versions").fetchall())
    seen = dict(load.seen)
    recorded = wait_for(
        lambda: (
            (
                rows := db.execute(
                    "SELECT id::text, adapter_version_id::text, upstream_model, status_code FROM calls "
                    "WHERE id = ANY(%s::uuid[])",
                    (list(seen),),
                ).fetchall()
            )
            and len(rows) == len(seen)
            and rows
        ),
        timeout=30,
        message="all calls recorded",
    )
    assert {row[3] for row in recorded} == {200}
    assert all(names[row[1]] == row[2] == seen[row[0]] for row in recorded)
    assert {seen[c] for c in seen} >= {"agent-v1", "agent-v2"}, "the load ran across the switches"

    # The reconciler: an endpoint that lost the promoted adapter (restart) gets it back; versions that
    # stopped serving are unloaded once the grace period is over.
    assert httpx.post(f"{local_server.api_base}/unload_lora_adapter", json={"lora_name": "agent-v1"}).status_code == 200
    tick(database_url, policy)
    assert {"agent-v1", "agent-v2", "agent-v3"} <= set(local_server.models())
    # Past the grace on the database's clock, which time-stamped the transitions (not this process's).
    database_clock = db.execute("SELECT clock_timestamp()").fetchone()[0]
    tick(database_url, policy, now=database_clock + timedelta(seconds=grace_s + 1))
    assert {m for m in local_server.models() if m.startswith("agent-")} == {"agent-v1"}


def test_reviewed_policy_waits_for_the_admin(start_gateway, local_server, tiny, db, database_url, tmp_path):
    rng = random.Random(7)
    policy = policy_config("reviewer", local_server, mode="reviewed", min_samples=4)
    gateway = start_gateways(start_gateway, tmp_path, policy, count=1)[0]
    add_candidate(db, "reviewer", 1, tiny.adapters[1])
    assert admin(gateway, "POST", "/versions/reviewer-v1/promote").status_code == 200
    v2 = add_candidate(db, "reviewer", 2, tiny.adapters[3])
    tick(database_url, policy)
    assert status_of(db, v2) == "canary"
    serves_canary([gateway], "reviewer", "reviewer-v2")
    canary_round(db, [gateway], "reviewer", ("reviewer-v2", "reviewer-v1"), 0.8, 0.3, rng)

    report = tick(database_url, policy)
    assert status_of(db, v2) == "canary", "a reviewed policy never promotes by itself"
    assert ("reviewer-v2", "awaiting_review") in {(a["version"], a["action"]) for a in report.actions}
    detail = admin(gateway, "GET", "/versions/reviewer-v2").json()
    assert detail["status"] == "canary" and detail["training_run"]["status"] == "succeeded"
    assert detail["gates"]["outcome"] == "pass"
    evaluation = detail["evaluation"]
    assert evaluation["verdict"] == "better" and evaluation["decision"] == "review"
    interval = evaluation["interval"]
    assert evaluation["canary"]["n"] >= 5 and interval["wealth_better"] >= interval["threshold_better"] > 0
    assert [t["to_status"] for t in detail["transitions"]] == ["canary"]

    # Errors: OpenAI format, 404 for unknown versions, 409 naming the current status.
    missing = admin(gateway, "POST", "/versions/reviewer-v9/approve")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "version_not_found"
    conflict = admin(gateway, "POST", "/policies/reviewer/rollback", {"version": 2})
    assert conflict.status_code == 409 and "reviewer-v2 is canary" in conflict.json()["error"]["message"]
    assert (
        httpx.get(
            f"{gateway.base_url}/admin/policies", timeout=30, headers={"Authorization": "Bearer nope"}
        ).status_code
        == 401
    )

    paused = admin(gateway, "POST", "/policies/reviewer/pause")
    assert paused.status_code == 200 and paused.json()["learning_paused"] is True
    assert admin(gateway, "GET", "/policies/reviewer").json()["learning_paused"] is True
    assert admin(gateway, "POST", "/policies/reviewer/resume").json()["learning_paused"] is False

    approved = admin(gateway, "POST", "/versions/reviewer-v2/approve", {"reason": "rewards look better"})
    assert approved.status_code == 200, approved.text
    assert approved.json()["changed"] and approved.json()["version"]["status"] == "promoted"
    assert admin(gateway, "POST", "/versions/reviewer-v2/approve").json()["changed"] is False
    routes_to([gateway], "reviewer", "reviewer-v2")
    actors = db.execute(
        "SELECT v.name, t.to_status, t.actor, t.reason FROM adapter_transitions t JOIN "
        "adapter_versions v ON v.id = t.adapter_version_id WHERE t.to_status = 'promoted' "
        "ORDER BY t.id"
    ).fetchall()
    assert actors[-1] == ("reviewer-v2", "promoted", "admin", "rewards look better")
    versions = admin(gateway, "GET", "/policies/reviewer/versions").json()["data"]
    assert [(v["name"], v["status"]) for v in versions] == [("reviewer-v2", "promoted"), ("reviewer-v1", "retired")]
