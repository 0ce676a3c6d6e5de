"""Multi-turn runs become one trajectory, named or not, on one process or several."""

from __future__ import annotations

import uuid

import httpx
import openai

from tests.conftest import count_rows, wait_for

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def run_agent(clients: list[openai.OpenAI], task: str, turns: int = 3, **extra) -> tuple[list[str], list[str]]:
    """A small agent loop; call i goes to clients[i % len(clients)]. Returns trajectory and call ids."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": task}]
    trajectory_ids, call_ids = [], []
    for turn in range(turns):
        client = clients[turn % len(clients)]
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=messages, tools=TOOLS if turn == 0 else None, **extra
        )
        completion = raw.parse()
        trajectory_ids.append(raw.headers["x-apprentice-trajectory-id"])
        call_ids.append(raw.headers["x-apprentice-call-id"])
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # as agents do: the SDK object back
        if message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "42"})
        else:
            messages.append({"role": "user", "content": f"continue {turn}"})
    return trajectory_ids, call_ids


def trajectory_of(db, call_id: str) -> str:
    """The trajectory a call ended up in, following merges."""
    return db.execute("SELECT trajectory_id::text FROM calls WHERE id = %s", (call_id,)).fetchone()[0]


def resolve(db, trajectory_id: str) -> str:
    row = db.execute(
        "SELECT coalesce(merged_into, id)::text FROM trajectories WHERE id = %s", (trajectory_id,)
    ).fetchone()
    return row[0]


def test_same_process_run_is_one_trajectory_and_distinct_runs_are_not(start_gateway, db):
    gateway = start_gateway()
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    first, first_calls = run_agent([client], "task A", turns=4)
    second, second_calls = run_agent([client], "task A", turns=2, seed=7)  # same task, another run
    assert len(set(first)) == 1, "every call of the run answers with the same X-Trajectory-Id"
    assert len(set(second)) == 1 and second[0] != first[0]
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 6)
    assert {trajectory_of(db, c) for c in first_calls} == {first[0]}
    wait_for(lambda: count_rows(db, "SELECT call_count FROM trajectories WHERE id = %s", first[0]) == 4)
    assert count_rows(db, "SELECT count(*) FROM calls WHERE stitch_pending") == 0


def test_run_across_two_gateway_processes_is_stitched(start_gateway, db):
    """Consecutive calls alternate between two gateways: the store joins them into one."""
    gateways = [start_gateway(), start_gateway()]
    clients = [openai.OpenAI(base_url=g.base_url, api_key="x", max_retries=0) for g in gateways]
    runs = [run_agent(clients, f"cross task {i}", turns=4) for i in range(3)]
    all_calls = [c for _, calls in runs for c in calls]
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == len(all_calls))

    def stitched() -> bool:
        return (
            all(len({trajectory_of(db, c) for c in calls}) == 1 for _, calls in runs)
            and count_rows(db, "SELECT count(*) FROM calls WHERE stitch_pending") == 0
        )

    wait_for(stitched, timeout=20, message="cross-process stitching")
    final = [trajectory_of(db, calls[0]) for _, calls in runs]
    assert len(set(final)) == 3, "three runs stay three trajectories"
    for (returned_ids, _calls), trajectory_id in zip(runs, final, strict=True):
        # Every id the client was given still resolves to the run's trajectory.
        assert {resolve(db, t) for t in returned_ids} == {trajectory_id}
        assert count_rows(db, "SELECT call_count FROM trajectories WHERE id = %s", trajectory_id) == 4
    assert count_rows(db, "SELECT count(*) FROM trajectories WHERE merged_into IS NULL") == 3


def test_client_named_trajectory_and_group(start_gateway, db, fake_upstream):
    gateway = start_gateway()
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    name = f"ticket-{uuid.uuid4().hex[:8]}"
    by_header = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "one"}],
        extra_headers={"X-Trajectory-Id": name, "X-Group-Id": "task-7"},
    )
    marker = uuid.uuid4().hex
    by_metadata = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "unrelated words"}],
        metadata={"trajectory_id": name, "keep": marker},
    )
    assert by_header.headers["x-apprentice-trajectory-id"] == by_metadata.headers["x-apprentice-trajectory-id"]
    # Apprentice's metadata keys are stripped before forwarding; the client's own are kept.
    forwarded = [
        b
        for b in httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]
        if (b.get("metadata") or {}).get("keep") == marker
    ]
    assert forwarded and forwarded[0]["metadata"] == {"keep": marker}
    trajectory_id = by_header.headers["x-apprentice-trajectory-id"]
    row = wait_for(
        lambda: (
            db.execute(
                "SELECT client_trajectory_id, group_id, call_count FROM trajectories WHERE id = %s", (trajectory_id,)
            ).fetchone()
            if count_rows(db, "SELECT count(*) FROM calls") == 2
            else None
        )
    )
    assert row == (name, "task-7", 2)
    # Echoing the gateway's own id back keeps the call in the same trajectory.
    echoed = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "three"}],
        extra_headers={"X-Trajectory-Id": trajectory_id},
    )
    assert echoed.headers["x-apprentice-trajectory-id"] == trajectory_id


def test_tenants_do_not_share_trajectories(start_gateway, database_url, db):
    """The same conversation under two tenants' keys stays apart, even with the same client id."""
    import asyncio

    from apprentice.store.engine import make_async_engine
    from gateway.auth.keys import create_key

    async def make_keys() -> list[str]:
        engine = make_async_engine(database_url)
        keys = [(await create_key(engine, name=t, tenant=t))[1] for t in ("acme", "globex")]
        await engine.dispose()
        return keys

    keys = asyncio.run(make_keys())
    gateway = start_gateway(auth={"mode": "keys"})
    ids = []
    for key in keys:
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model",
            messages=[{"role": "user", "content": "same"}],
            extra_headers={"X-Trajectory-Id": "run-1"},
        )
        ids.append(raw.headers["x-apprentice-trajectory-id"])
    assert ids[0] != ids[1]
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM trajectories") == 2)
    assert {r[0] for r in db.execute("SELECT tenant FROM trajectories").fetchall()} == {"acme", "globex"}


def test_another_tenants_echoed_id_starts_a_trajectory_of_the_caller(start_gateway, database_url, db):
    """Tenant B sending tenant A's trajectory id neither joins A's trajectory nor learns it exists."""
    import asyncio

    from apprentice.store.engine import make_async_engine
    from gateway.auth.keys import create_key

    async def make_keys() -> list[str]:
        engine = make_async_engine(database_url)
        keys = [(await create_key(engine, name=t, tenant=t))[1] for t in ("acme", "globex")]
        await engine.dispose()
        return keys

    acme_key, globex_key = asyncio.run(make_keys())
    gateway = start_gateway(auth={"mode": "keys"})
    acme = openai.OpenAI(base_url=gateway.base_url, api_key=acme_key, max_retries=0)
    globex = openai.OpenAI(base_url=gateway.base_url, api_key=globex_key, max_retries=0)
    first = acme.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "a"}]
    )
    acme_id = first.headers["x-apprentice-trajectory-id"]
    assert uuid.UUID(acme_id).version == 7

    def echo(client: openai.OpenAI, trajectory_id: str) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model",
            messages=[{"role": "user", "content": "b"}],
            extra_headers={"X-Trajectory-Id": trajectory_id},
        )
        return raw.headers["x-apprentice-trajectory-id"]

    stolen = echo(globex, acme_id)
    never_issued = str(uuid.UUID(int=uuid.UUID(acme_id).int ^ 1))  # a v7 id nobody was given
    assert stolen != acme_id and echo(globex, never_issued) != never_issued
    assert echo(globex, acme_id) == stolen, "the same name keeps naming the caller's own trajectory"
    assert echo(acme, acme_id) == acme_id, "the owner's echo still continues its run"
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 5)
    tenants_in_acme_trajectory = db.execute(
        "SELECT DISTINCT tenant FROM calls WHERE trajectory_id = %s", (acme_id,)
    ).fetchall()
    assert tenants_in_acme_trajectory == [("acme",)]
    assert count_rows(db, "SELECT call_count FROM trajectories WHERE id = %s", acme_id) == 2
    row = db.execute("SELECT tenant, client_trajectory_id FROM trajectories WHERE id = %s", (stolen,)).fetchone()
    assert row == ("globex", acme_id)
