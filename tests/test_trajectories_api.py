"""GET /v1/trajectories/{id} (calls, rewards, group) and the admin listing with its filters,
with rewards addressed by every kind of target."""

from __future__ import annotations

import time

import httpx

from tests.support.gateway_calls import chat, post, shipped


def test_targets_trajectory_api_and_listing(start_gateway, db):
    gateway = start_gateway()
    first = chat(gateway, "solve task one", client_id="run-1")
    second = chat(gateway, "solve task two")
    third = chat(gateway, "solve task three")
    trajectory_1, trajectory_2 = (
        first.headers["x-apprentice-trajectory-id"],
        second.headers["x-apprentice-trajectory-id"],
    )
    trajectory_3 = third.headers["x-apprentice-trajectory-id"]
    shipped(db, 3)

    by_client = post(
        gateway,
        {
            "client_trajectory_id": "run-1",
            "reward": 1,
            "metrics": {"tests": 3},
            "comment": "all green",
            "group_id": "task-A",
        },
    )
    assert by_client.status_code == 200, by_client.text
    body = by_client.json()
    assert body["object"] == "reward" and body["status"] == "linked" and body["current"] is True
    assert body["trajectory_id"] == trajectory_1 and body["reward"] == 1.0 and body["metrics"] == {"tests": 3.0}

    by_call = post(gateway, {"call_id": second.json()["id"], "reward": 0.25, "group_id": "task-A"})
    assert by_call.json()["trajectory_id"] == trajectory_2, by_call.text
    by_call_uuid = post(gateway, {"call_id": third.headers["x-apprentice-call-id"], "reward": -0.5})
    assert by_call_uuid.json()["trajectory_id"] == trajectory_3
    by_id = post(gateway, {"trajectory_id": trajectory_1, "reward": 0.75, "name": "style"})
    assert by_id.json()["status"] == "linked"

    one = httpx.get(gateway.base_url + f"/trajectories/{trajectory_1}").json()
    assert one["id"] == trajectory_1 and one["client_trajectory_id"] == "run-1" and one["group_id"] == "task-A"
    assert [c["response_id"] for c in one["calls"]] == [first.json()["id"]]
    assert one["calls"][0]["request"]["messages"][0]["content"] == "solve task one"
    assert sorted((r["name"], r["reward"]) for r in one["rewards"]) == [("reward", 1.0), ("style", 0.75)]
    assert one["reward"] == 1.0 and one["reward_count"] == 2
    assert one["group_trajectory_ids"] == [trajectory_2] and "adapter_version_id" in one
    assert httpx.get(gateway.base_url + "/trajectories/run-1").json()["id"] == trajectory_1, "client id works too"
    missing = httpx.get(gateway.base_url + "/trajectories/no-such-run")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"

    listing = httpx.get(gateway.base_url + "/trajectories", params={"group_id": "task-A"}).json()
    assert {t["id"] for t in listing["data"]} == {trajectory_1, trajectory_2}
    unrewarded = httpx.get(gateway.base_url + "/trajectories", params={"rewarded": "false"}).json()
    assert unrewarded["data"] == []
    page = httpx.get(gateway.base_url + "/trajectories", params={"limit": 2}).json()
    assert len(page["data"]) == 2 and page["has_more"] is True
    rest = httpx.get(
        gateway.base_url + "/trajectories", params={"limit": 2, "starting_after": page["next_starting_after"]}
    ).json()
    assert len(rest["data"]) == 1 and rest["has_more"] is False
    future = httpx.get(gateway.base_url + "/trajectories", params={"since": time.time() + 3600}).json()
    assert future["data"] == []
    assert httpx.get(gateway.base_url + f"/rewards/{body['id']}").json()["id"] == body["id"]

    spec = httpx.get(gateway.url + "/openapi.json").json()
    assert "requestBody" in spec["paths"]["/v1/rewards"]["post"]
    assert {"/v1/trajectories", "/v1/trajectories/{trajectory_id}", "/v1/rewards/pending"} <= set(spec["paths"])
