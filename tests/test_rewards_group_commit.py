"""Group commit of single rewards (gateway/rewards/group_commit.py): concurrent requests share
transactions, and each keeps its own answer: refusals, replays, replayed signatures and the
pending bound apply per request, as if they had arrived one after the other."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import httpx
import psycopg

from apprentice.store.engine import make_async_engine
from gateway.rewards.group_commit import GroupCommitter
from gateway.store.rewards import Ingested, IntakeRequest, NewReward
from gateway.trajectories.stitching import uuid7
from tests.conftest import count_rows, wait_for
from tests.support.gateway_calls import chat, post, shipped
from tests.test_durability import proxied
from tests.test_rewards import POLICY


def reward(target: uuid.UUID, key: str | None, value: float = 0.5, comment: str | None = None) -> NewReward:
    return NewReward(
        id=uuid7(),
        tenant="local",
        target_kind="trajectory",
        target=str(target),
        target_trajectory_id=target,
        target_call=None,
        name="reward",
        value=value,
        metrics={},
        comment=comment,
        group_id=None,
        idempotency_key=key,
        source="key",
        api_key_id=None,
        observed_at=None,
    )


def accept(_: list[tuple[int, str | None]]) -> None:
    return None


def refuse(_: list[tuple[int, str | None]]) -> None:
    raise ValueError("refused by its policy")


def store_trajectories(db: psycopg.Connection, n: int) -> list[uuid.UUID]:
    ids = [uuid7() for _ in range(n)]
    for trajectory in ids:
        db.execute(
            "INSERT INTO trajectories (id, tenant, model, first_call_at, last_call_at) "
            "VALUES (%s, 'local', 'm', now(), now())",
            (trajectory,),
        )
    return ids


def test_concurrent_requests_share_transactions_and_keep_their_own_answers(database_url, db):
    stored = store_trajectories(db, 20)
    never = [uuid7() for _ in range(8)]  # trajectories that are never stored: pending rewards
    requests: list[tuple[str, IntakeRequest]] = []
    for i in range(100):
        requests.append(("new", IntakeRequest([reward(stored[i % 20], f"k{i}")], accept)))
    for i in range(10):  # the same key and content as a reward of this flood: one row, its answer
        requests.append(("replay", IntakeRequest([reward(stored[i % 20], f"k{i}")], accept)))
    for i in range(10):
        requests.append(("refused", IntakeRequest([reward(stored[i], f"refused{i}")], refuse)))
    for i in range(8):  # the bound is 5: five are pending, three refused (which ones: arrival order)
        requests.append(("pending", IntakeRequest([reward(never[i], f"p{i}")], accept)))
    signature = (b"\x01" * 32, "local", 1.0e9)
    requests.append(("signed-refused", IntakeRequest([reward(stored[0], "s0")], refuse, signature)))
    for i in range(2):  # one of the two uses the signature (and the refused one, if first, released it)
        requests.append(("signed", IntakeRequest([reward(stored[1], f"s{i + 1}")], accept, signature)))

    async def flood() -> tuple[list[Ingested | BaseException], int]:
        engine = make_async_engine(database_url)
        committer = GroupCommitter(engine, max_pending=5)
        try:
            outcomes = await asyncio.gather(
                *(committer.submit(request) for _, request in requests), return_exceptions=True
            )
        finally:
            await engine.dispose()
        return list(outcomes), committer.groups

    outcomes, groups = asyncio.run(flood())
    assert groups < len(requests) / 10, f"{groups} transactions for {len(requests)} requests"
    by_key: dict[str, Ingested] = {}
    seen: dict[str, list[str]] = {}
    for (kind, request), outcome in zip(requests, outcomes, strict=True):
        seen.setdefault(kind, []).append(type(outcome).__name__)
        if isinstance(outcome, Ingested) and kind != "replay":
            assert not outcome.replayed, (kind, outcome)
            [row] = outcome.stored
            assert row.id == request.rewards[0].id
            assert row.status == ("pending" if kind == "pending" else "linked")
            by_key[row.idempotency_key or ""] = outcome
    for (kind, request), outcome in zip(requests, outcomes, strict=True):
        if kind == "replay":
            assert isinstance(outcome, Ingested) and outcome.replayed, outcome
            original = by_key[request.rewards[0].idempotency_key or ""]
            assert outcome.stored[0].id == original.stored[0].id
    assert seen["new"] == ["Ingested"] * 100
    assert seen["refused"] == ["ValueError"] * 10
    assert sorted(seen["pending"]) == ["Ingested"] * 5 + ["TooManyPending"] * 3
    assert sorted(seen["signed"]) == ["Ingested", "ReplayedSignature"]
    assert seen["signed-refused"] in (["ValueError"], ["ReplayedSignature"])

    assert count_rows(db, "SELECT count(*) FROM rewards") == 100 + 5 + 1
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'pending'") == 5
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE idempotency_key LIKE 'refused%%'") == 0
    # The refused delivery released its signature; the next one with it used it.
    assert count_rows(db, "SELECT count(*) FROM reward_signatures") == 1
    # Latest wins per trajectory, as if the rewards had arrived one by one.
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'linked' AND superseded_at IS NULL") == 20


def test_a_request_that_fails_its_statement_fails_alone(database_url, db):
    """A statement error caused by one request's data (the committer splits the group and retries
    each request alone) fails that request only."""
    stored = store_trajectories(db, 3)
    # jsonb cannot hold \\u0000: the insert fails for this reward (the API refuses it earlier, with a 400).
    requests = [
        IntakeRequest([reward(stored[i % 3], f"g{i}", comment="x\x00" if i == 5 else None)], accept) for i in range(40)
    ]

    async def flood() -> tuple[list[Ingested | BaseException], int]:
        engine = make_async_engine(database_url)
        committer = GroupCommitter(engine, max_pending=None)
        try:
            outcomes = await asyncio.gather(*(committer.submit(r) for r in requests), return_exceptions=True)
        finally:
            await engine.dispose()
        return list(outcomes), committer.groups

    outcomes, groups = asyncio.run(flood())
    failed = [i for i, outcome in enumerate(outcomes) if not isinstance(outcome, Ingested)]
    assert failed == [5], outcomes[5]
    assert isinstance(outcomes[5], psycopg.Error)
    assert count_rows(db, "SELECT count(*) FROM rewards") == 39
    assert groups > 3  # the failing group was split


def test_concurrent_posts_through_the_gateway_each_get_their_own_answer(start_gateway, fake_upstream, db):
    policy = {"name": POLICY, "base_model": "fake-base", "endpoints": [fake_upstream.api_base], "reward_range": [0, 1]}
    gateway = start_gateway(policies=[policy])
    trajectories = [chat(gateway, f"run {i}", model=POLICY).headers["x-apprentice-trajectory-id"] for i in range(10)]
    shipped(db, 10)
    posts: list[tuple[str, dict]] = []
    for i in range(120):
        posts.append(("new", {"trajectory_id": trajectories[i % 10], "reward": i / 120, "idempotency_key": f"k{i}"}))
    posts += [("again", body) for _, body in posts[:40]]  # the same deliveries twice
    posts += [
        ("range", {"trajectory_id": trajectories[i % 10], "reward": 5, "idempotency_key": f"r{i}"}) for i in range(20)
    ]
    posts += [("nul", {"trajectory_id": trajectories[0], "reward": 1, "comment": f"a\x00{i}"}) for i in range(10)]
    random.Random(3).shuffle(posts)

    async def flood() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
        async with httpx.AsyncClient(base_url=gateway.base_url, limits=limits, timeout=60) as client:
            return await asyncio.gather(*(client.post("/rewards", json=body) for _, body in posts))

    answers = asyncio.run(flood())
    by_key: dict[str, list[httpx.Response]] = {}
    for (kind, body), answer in zip(posts, answers, strict=True):
        if kind in ("new", "again"):
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "linked" and answer.json()["reward"] == body["reward"]
            by_key.setdefault(body["idempotency_key"], []).append(answer)
        elif kind == "range":
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "reward_out_of_range"
            assert answer.json()["error"]["param"] == "reward"
        else:
            assert answer.status_code == 400, answer.text
            assert (answer.json()["error"]["param"], answer.json()["error"]["code"]) == ("comment", "invalid_value")
    for key, pair in by_key.items():
        assert len({answer.json()["id"] for answer in pair}) == 1, key
        assert [a.headers.get("idempotent-replayed") for a in pair].count(None) == 1, key  # one stored it
    assert count_rows(db, "SELECT count(*) FROM rewards") == 120
    # Latest wins: each trajectory's current reward is the one with the greatest (observed_at, seq).
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'linked' AND superseded_at IS NULL") == 10


def test_a_reward_during_a_database_outage_is_refused_with_503_and_stored_once_after(start_gateway, database_url, db):
    """Today's answer to an outage, kept: a reward is answered 200 only once committed; while
    PostgreSQL is away the sender gets a 503 (OpenAI's format, Retry-After) and retries."""
    proxy, via_proxy = proxied(database_url)
    try:
        gateway = start_gateway(database_url=via_proxy)
        trajectory = chat(gateway, "a run").headers["x-apprentice-trajectory-id"]
        shipped(db, 1)
        body = {"trajectory_id": trajectory, "reward": 0.5, "idempotency_key": "during-outage"}
        assert post(gateway, {**body, "idempotency_key": "before"}).status_code == 200
        proxy.cut()
        started = time.monotonic()
        for payload in (body, {"rewards": [body, {**body, "idempotency_key": "second"}]}):
            refused = post(gateway, payload)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "store_unavailable"
            assert refused.json()["error"]["type"] == "service_unavailable"
            assert int(refused.headers["retry-after"]) >= 1
        assert time.monotonic() - started < 20, "refused at once, not after the client's timeout"
        proxy.restore()
        stored = wait_for(lambda: (r := post(gateway, body)).status_code == 200 and r, message="stored after")
        again = post(gateway, body)
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.json()["id"] == stored.json()["id"]
        assert count_rows(db, "SELECT count(*) FROM rewards WHERE idempotency_key = 'during-outage'") == 1
        assert count_rows(db, "SELECT count(*) FROM rewards") == 2
    finally:
        proxy.close()
