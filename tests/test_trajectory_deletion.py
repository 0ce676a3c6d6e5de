"""DELETE /v1/trajectories/{id}: calls, rewards and pending training use removed; versions
already trained on it listed; another tenant's trajectory untouchable."""

from __future__ import annotations

import asyncio
import uuid

import httpx

from tests.conftest import count_rows
from tests.support.gateway_calls import chat, post, shipped


def _keys(database_url: str) -> list[str]:
    from apprentice.store.engine import make_async_engine
    from gateway.auth.keys import create_key

    async def make() -> list[str]:
        engine = make_async_engine(database_url)
        keys = [(await create_key(engine, name=t, tenant=t))[1] for t in ("acme", "globex")]
        await engine.dispose()
        return keys

    return asyncio.run(make())


def test_a_trajectory_is_deleted_with_its_calls_and_rewards_by_its_owner_only(start_gateway, database_url, db):
    acme, globex = _keys(database_url)
    gateway = start_gateway(auth={"mode": "keys"})
    first = chat(gateway, "private task", client_id="run-7", key=acme)
    chat(gateway, "another acme task", key=acme)
    shipped(db, 2)
    internal = first.headers["x-apprentice-trajectory-id"]
    assert post(gateway, {"trajectory_id": "run-7", "reward": 1.0}, key=acme).status_code == 200
    # A second reward, named by the client id and under another name, goes too.
    assert post(gateway, {"client_trajectory_id": "run-7", "reward": 0.5, "name": "late"}, key=acme).status_code == 200

    url = gateway.base_url + "/trajectories/run-7"
    refused = httpx.delete(url, headers={"Authorization": f"Bearer {globex}"})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    assert count_rows(db, "SELECT count(*) FROM trajectories WHERE id = %s", internal) == 1

    deleted = httpx.delete(url, headers={"Authorization": f"Bearer {acme}"})
    assert deleted.status_code == 200, deleted.text
    body = deleted.json()
    assert body == {
        "id": internal,
        "object": "trajectory.deleted",
        "deleted": True,
        "aliases": [],
        "calls": 1,
        "rewards": 2,
        "trained_into": [],
    }
    assert count_rows(db, "SELECT count(*) FROM trajectories WHERE id = %s", internal) == 0
    assert count_rows(db, "SELECT count(*) FROM calls WHERE trajectory_id = %s", internal) == 0
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE trajectory_id = %s", internal) == 0
    assert count_rows(db, "SELECT count(*) FROM calls") == 1, "the other trajectory stays"
    again = httpx.delete(url, headers={"Authorization": f"Bearer {acme}"})
    assert again.status_code == 404


def test_deleting_a_trained_trajectory_lists_the_versions_trained_on_it(start_gateway, db):
    gateway = start_gateway()
    trajectory = chat(gateway, "trained task").headers["x-apprentice-trajectory-id"]
    shipped(db, 1)
    run, child_run = uuid.uuid4(), uuid.uuid4()
    v1, v2 = uuid.uuid4(), uuid.uuid4()
    db.execute("INSERT INTO training_runs (id, policy, status) VALUES (%s, 'p', 'succeeded')", (run,))
    db.execute("INSERT INTO training_runs (id, policy, status) VALUES (%s, 'p', 'succeeded')", (child_run,))
    for version_id, number, parent, training_run in ((v1, 1, None, run), (v2, 2, v1, child_run)):
        db.execute(
            "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, parent_version_id, "
            "training_run_id) VALUES (%s, 'p', %s, %s, 'candidate', 'base', '/tmp/x', %s, %s)",
            (version_id, number, f"p-v{number}", parent, training_run),
        )
    db.execute("UPDATE training_runs SET produced_version_id = %s WHERE id = %s", (v1, run))
    db.execute("UPDATE training_runs SET produced_version_id = %s WHERE id = %s", (v2, child_run))
    db.execute("UPDATE trajectories SET trained_in_run_id = %s WHERE id = %s", (run, trajectory))

    deleted = httpx.delete(gateway.base_url + f"/trajectories/{trajectory}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["trained_into"] == [
        {"name": "p-v1", "policy": "p", "status": "candidate", "direct": True},
        {"name": "p-v2", "policy": "p", "status": "candidate", "direct": False},
    ]
