"""Opting out of training: per policy (`record_for_training: false`) and per key (`apprentice keys
training KEY --opt-out`). The calls are still recorded; their trajectories are `trainable = false`,
and the learner's selection and the judge's choice of groups skip them.

Real gateway, real PostgreSQL, the official openai client; the policies' endpoint is the fake
upstream (it returns token ids like vLLM), and the learner's selection runs on what was stored.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import psycopg
import pytest

from apprentice.settings import PolicySettings
from apprentice.store.engine import make_async_engine
from gateway.judging.store import find_ready_groups
from learner.jobs.selection import count_new_groups, select
from tests.conftest import wait_for
from tests.support.processes import cli
from tests.test_ui import login

ADMIN_KEY = "admin-key-for-opt-out-tests"


def policies(api_base: str) -> list[dict[str, Any]]:
    return [
        {"name": "agent", "base_model": "fake-model", "endpoints": [api_base]},
        {"name": "private-agent", "base_model": "fake-model", "endpoints": [api_base], "record_for_training": False},
    ]


def policy_settings(api_base: str, name: str) -> PolicySettings:
    [data] = [p for p in policies(api_base) if p["name"] == name]
    return PolicySettings.model_validate(
        {**data, "learning": {"reward_wait_s": 0}, "judge": {"model": "fake-model", "wait_s": 0}}
    )


def run(client: openai.OpenAI, model: str, task: str, run_id: str) -> str:
    """One call of a run (a group: the task); returns the gateway's trajectory id."""
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": task}],
        extra_headers={"X-Trajectory-Id": run_id, "X-Group-Id": task},
    )
    return raw.headers["x-apprentice-trajectory-id"]


def trainable(db: psycopg.Connection, trajectory_id: str) -> bool:
    row = wait_for(
        lambda: db.execute("SELECT trainable FROM trajectories WHERE id = %s", (trajectory_id,)).fetchone(),
        message=f"trajectory {trajectory_id}",
    )
    return bool(row[0])


def reward(base_url: str, key: str, trajectory_id: str, value: float) -> None:
    answer = httpx.post(
        base_url + "/rewards",
        json={"trajectory_id": trajectory_id, "reward": value},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert answer.status_code == 200, answer.text


def selected(database_url: str, policy: PolicySettings) -> tuple[set[str], int]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        return set(select(connection, policy).candidates), count_new_groups(connection, policy)


def ready_for_judge(database_url: str, policy: PolicySettings) -> set[str]:
    async def main() -> set[str]:
        engine = make_async_engine(database_url)
        try:
            assert policy.judge is not None
            chunks = await find_ready_groups(engine, policy, policy.judge, "rubric")
        finally:
            await engine.dispose()
        return {member for chunk in chunks for member in chunk.trajectory_ids}

    return asyncio.run(main())


@pytest.fixture
def gateway(start_gateway, fake_upstream):
    return start_gateway(policies=policies(fake_upstream.api_base), auth={"mode": "keys", "admin_key": ADMIN_KEY})


def test_a_policy_that_does_not_record_for_training(gateway, fake_upstream, db, database_url):
    client = openai.OpenAI(base_url=gateway.base_url, api_key=ADMIN_KEY, max_retries=0)
    trained = [run(client, "agent", "task A", f"a{i}") for i in range(2)]
    private = [run(client, "private-agent", "task A", f"p{i}") for i in range(2)]
    assert [trainable(db, t) for t in trained] == [True, True]
    assert [trainable(db, t) for t in private] == [False, False]
    calls = db.execute("SELECT count(*) FROM calls WHERE policy = 'private-agent'").fetchone()[0]
    assert calls == 2  # still recorded, for observability

    agent, private_agent = (policy_settings(fake_upstream.api_base, n) for n in ("agent", "private-agent"))
    assert ready_for_judge(database_url, agent) == set(trained)
    assert ready_for_judge(database_url, private_agent) == set()

    for trajectory, value in zip(trained + private, [1.0, 0.0, 1.0, 0.0], strict=True):
        reward(gateway.base_url, ADMIN_KEY, trajectory, value)
    wait_for(lambda: db.execute("SELECT count(*) FROM rewards WHERE status = 'linked'").fetchone()[0] == 4)
    assert selected(database_url, agent) == (set(trained), 1)
    assert selected(database_url, private_agent) == (set(), 0)

    shown = httpx.get(
        gateway.base_url + f"/trajectories/{private[0]}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert shown.status_code == 200 and shown.json()["trainable"] is False
    listing = httpx.get(
        gateway.base_url + "/trajectories", params={"policy": "agent"}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ).json()
    assert {t["trainable"] for t in listing["data"]} == {True}
    with httpx.Client(base_url=gateway.url, timeout=30) as ui:  # the dashboard says so too
        assert login(ui, ADMIN_KEY).status_code == 303
        assert 'data-testid="trajectory-not-trainable"' in ui.get(f"/ui/trajectories/{private[0]}").text
        assert 'data-testid="trajectory-not-trainable"' not in ui.get(f"/ui/trajectories/{trained[0]}").text


def test_a_key_that_opts_out(gateway, fake_upstream, db, database_url, tmp_path):
    def create(name: str) -> str:
        created = cli(database_url, tmp_path, "keys", "create", "--name", name, "--tenant", "acme")
        assert created.returncode == 0, created.stderr
        return created.stdout.strip()

    keep, leave = create("keeps"), create("leaves")
    clients = {key: openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0) for key in (keep, leave)}
    before = run(clients[leave], "agent", "task B", "early")  # before the opt-out
    assert trainable(db, before)

    opted = cli(database_url, tmp_path, "keys", "training", leave[:12], "--opt-out")
    assert opted.returncode == 0, opted.stderr
    assert "1 trajectories not yet trained on were withdrawn" in opted.stdout
    flag = db.execute("SELECT training_opt_out FROM api_keys WHERE key_prefix = %s", (leave[:12],)).fetchone()
    assert flag == (True,)
    listed = cli(database_url, tmp_path, "keys", "list").stdout.splitlines()
    assert [("training=opted-out" in line) for line in listed] == [False, True]  # keeps, then leaves
    assert not trainable(db, before)

    kept = run(clients[keep], "agent", "task B", "k1")
    left = run(clients[leave], "agent", "task B", "l1")
    assert trainable(db, kept) and not trainable(db, left)
    # A run that an opted-out key continues is withdrawn as a whole.
    mixed = run(clients[keep], "agent", "task C", "shared")
    assert trainable(db, mixed)
    assert run(clients[leave], "agent", "task C", "shared") == mixed
    wait_for(lambda: not trainable(db, mixed), message="the continued run withdrawn")

    for trajectory in (kept, left, before):
        reward(gateway.base_url, keep, trajectory, 1.0 if trajectory == kept else 0.0)
    kept_2 = run(clients[keep], "agent", "task B", "k2")
    reward(gateway.base_url, keep, kept_2, 0.5)
    wait_for(lambda: db.execute("SELECT count(*) FROM rewards WHERE status = 'linked'").fetchone()[0] == 4)
    assert selected(database_url, policy_settings(fake_upstream.api_base, "agent"))[0] == {kept, kept_2}

    back = cli(database_url, tmp_path, "keys", "training", leave[:12], "--opt-in")
    assert back.returncode == 0 and "opted in" in back.stdout
    assert trainable(db, run(clients[leave], "agent", "task D", "after"))
    missing = cli(database_url, tmp_path, "keys", "training", "apk-nosuchkey", "--opt-out")
    assert missing.returncode != 0 and "no active key matches" in missing.stderr
