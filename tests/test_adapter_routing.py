"""A policy's calls go to its promoted adapter, a share of runs to its canary, and every call
of a run to the same version, on every gateway process."""

from __future__ import annotations

import time
import uuid

import httpx
import openai

from tests.conftest import count_rows, wait_for


def add_version(db, policy: str, version: int, status: str, share: float | None = None) -> uuid.UUID:
    version_id = uuid.uuid4()
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, canary_share) "
        "VALUES (%s, %s, %s, %s, %s, 'fake-base', '/nowhere', %s)",
        (version_id, policy, version, f"{policy}-v{version}", status, share),
    )
    return version_id


def forwarded_models(fake_upstream) -> list[str]:
    return [b["model"] for b in httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]]


def run(clients: list[openai.OpenAI], task: str, turns: int = 3) -> list[str]:
    messages = [{"role": "user", "content": task}]
    served = []
    for turn in range(turns):
        completion = clients[turn % len(clients)].chat.completions.create(model="agent", messages=messages)
        served.append(completion.model)  # the fake upstream echoes the model it was asked for
        messages += [
            completion.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": f"go on {turn}"},
        ]
    return served


def test_promoted_canary_split_and_switch(start_gateway, fake_upstream, db):
    policy = {"name": "agent", "base_model": "fake-base", "endpoints": [fake_upstream.api_base]}
    # The margin is generous: a loaded CI machine can take longer than the default to ship a call.
    gateways = [
        start_gateway(policies=[policy], adapter_poll_interval_s=0.2, stitching={"parent_wait_margin_s": 5.0})
        for _ in range(2)
    ]
    clients = [openai.OpenAI(base_url=g.base_url, api_key="x", max_retries=0) for g in gateways]

    assert run(clients, "before any adapter", turns=1) == ["fake-base"]
    v1 = add_version(db, "agent", 1, "promoted")
    v2 = add_version(db, "agent", 2, "canary", share=0.5)
    time.sleep(0.8)
    runs = [run(clients, f"task number {i}") for i in range(24)]
    assert all(len(set(served)) == 1 for served in runs), "each run stays on one version across processes"
    arms = [served[0] for served in runs]
    assert set(arms) == {"agent-v1", "agent-v2"}
    assert 4 <= arms.count("agent-v2") <= 20, f"about half the runs on the canary: {arms.count('agent-v2')}/24"

    rows = wait_for(
        lambda: (
            (
                r := db.execute(
                    "SELECT upstream_model, adapter_version_id FROM calls WHERE adapter_version_id IS NOT NULL"
                ).fetchall()
            )
            and len(r) == 72
            and r
        )
    )
    assert {(name, str(vid)) for name, vid in rows} == {("agent-v1", str(v1)), ("agent-v2", str(v2))}

    # Promote the canary: every process routes new runs to it within a second.
    db.execute("UPDATE adapter_versions SET status = 'retired' WHERE id = %s", (v1,))
    db.execute("UPDATE adapter_versions SET status = 'promoted', canary_share = NULL WHERE id = %s", (v2,))
    time.sleep(0.8)
    after = [run(clients, f"later task {i}", turns=2) for i in range(8)]
    assert {m for served in after for m in served} == {"agent-v2"}

    # Roll back: the old version serves again.
    db.execute("UPDATE adapter_versions SET status = 'retired' WHERE id = %s", (v2,))
    db.execute("UPDATE adapter_versions SET status = 'promoted' WHERE id = %s", (v1,))
    time.sleep(0.8)
    assert run(clients, "after rollback", turns=2) == ["agent-v1", "agent-v1"]
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM trajectories WHERE adapter_version_id = %s", v2) >= 12)


def test_a_run_keeps_the_superseded_canary_for_half_the_unload_grace(start_gateway, fake_upstream, db):
    policy = {
        "name": "agent",
        "base_model": "fake-base",
        "endpoints": [fake_upstream.api_base],
        "promotion": {"unload_grace_s": 3.0},
    }  # a run keeps a stopped version for 1.5 s
    gateway = start_gateway(policies=[policy], adapter_poll_interval_s=0.1)
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    add_version(db, "agent", 1, "promoted")
    v2 = add_version(db, "agent", 2, "canary", share=1.0)
    time.sleep(0.5)

    def start(task: str) -> list[dict]:
        messages = [{"role": "user", "content": task}]
        completion = client.chat.completions.create(model="agent", messages=messages)
        assert completion.model == "agent-v2"
        return messages + [completion.choices[0].message.model_dump(exclude_none=True)]

    def go_on(messages: list[dict]) -> str:
        messages.append({"role": "user", "content": "go on"})
        completion = client.chat.completions.create(model="agent", messages=messages)
        messages.append(completion.choices[0].message.model_dump(exclude_none=True))
        return completion.model

    early, late = start("started on the canary"), start("also started on the canary")
    # the canary moves on to v3 (v2 back to candidate), as the promotion job does
    db.execute("UPDATE adapter_versions SET status = 'candidate', canary_share = NULL WHERE id = %s", (v2,))
    add_version(db, "agent", 3, "canary", share=1.0)
    time.sleep(0.5)
    assert go_on(early) == "agent-v2", "a run keeps the version it started on"
    assert run([client], "a new run", turns=1) == ["agent-v3"], "new runs go to the new canary"
    time.sleep(1.5)
    assert go_on(late) == "agent-v3", "past the grace the run follows the canary (the adapter may be unloading)"
