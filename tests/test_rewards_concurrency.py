"""1,000 concurrent reward posts with duplicates, replays and out-of-order arrival, some before
their trajectory exists, produce exactly the intended rows."""

from __future__ import annotations

import asyncio
import http.client
import random
import time
from collections import Counter

import httpx

from gateway.rewards.signatures import sign
from tests.conftest import count_rows, wait_for

SECRET = "whsec_concurrency_test"
EXISTING = 34  # trajectories stored before the flood
LATE = 10  # trajectories that only appear after their rewards
CONCURRENCY = 64


def plan_posts(targets: list[dict], base: float) -> tuple[list[dict], dict]:
    """Every post to send (shuffled), and what must be stored."""
    posts: list[dict] = []
    expected_rows = 0
    expected_current: dict[tuple[str, str], float] = {}
    for index, target in enumerate(targets):
        ref = target["ref"]
        # Five observations without an id, each delivered twice: every delivery is history,
        # the latest observation is current.
        for version in range(5):
            for _ in range(2):
                posts.append({"body": {**ref, "reward": version / 10, "timestamp": base + version}})
                expected_rows += 1
        # A keyed reward corrected twice; each version delivered three times (replays). Its
        # last version is observed after the unkeyed ones, so it is the current "reward".
        for version in range(3):
            for attempt in range(3):
                body = {
                    **ref,
                    "reward": 0.5 + version / 10,
                    "timestamp": base + 10 + version,
                    "idempotency_key": f"fix-{index}",
                }
                posts.append({"body": body, "signed": attempt == 2, "header_key": attempt == 1})
            expected_rows += 1
        # A second name, the same content four times: one row.
        for _ in range(4):
            posts.append({"body": {**ref, "name": "quality", "reward": 0.25, "idempotency_key": f"q-{index}"}})
        expected_rows += 1
        expected_current[(target["key"], "reward")] = 0.7
        expected_current[(target["key"], "quality")] = 0.25
    random.Random(7).shuffle(posts)
    return posts, {"rows": expected_rows, "current": expected_current}


async def flood(base_url: str, posts: list[dict]) -> Counter:
    statuses: Counter = Counter()
    semaphore = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:

        async def one(post: dict) -> None:
            body = dict(post["body"])
            headers = {"Content-Type": "application/json"}
            if post.get("header_key"):
                headers["Idempotency-Key"] = body.pop("idempotency_key")
            raw = httpx.Request("POST", "/", json=body).content
            if post.get("signed"):
                headers["Apprentice-Signature"] = sign(SECRET, raw)
            else:
                headers["Authorization"] = "Bearer x"
            async with semaphore:
                response = await client.post("/rewards", content=raw, headers=headers)
            statuses[response.status_code] += 1
            if response.status_code == 409:  # the same signed bytes within one second: a replay
                retry = {**headers, "Apprentice-Signature": sign(SECRET, raw, int(time.time()) + 1)}
                async with semaphore:
                    response = await client.post("/rewards", content=raw, headers=retry)
                statuses[f"retried {response.status_code}"] += 1
            assert response.status_code == 200, response.text

        await asyncio.gather(*(one(post) for post in posts))
    return statuses


def test_thousand_concurrent_rewards(start_gateway, db):
    gateway = start_gateway(rewards={"webhook_secrets": [{"secret": SECRET, "tenant": "local"}]})
    targets = []
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        for index in range(EXISTING):
            response = client.post(
                "/chat/completions",
                headers={"X-Trajectory-Id": f"run-{index}"},
                json={"model": "fake-model", "messages": [{"role": "user", "content": f"t{index}"}]},
            )
            trajectory, call = response.headers["x-apprentice-trajectory-id"], response.json()["id"]
            ref = [{"trajectory_id": trajectory}, {"call_id": call}, {"client_trajectory_id": f"run-{index}"}][
                index % 3
            ]
            targets.append({"key": trajectory, "ref": ref})
    targets += [{"key": f"late-{index}", "ref": {"client_trajectory_id": f"late-{index}"}} for index in range(LATE)]
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM trajectories") == EXISTING)

    posts, expected = plan_posts(targets, base=time.time() - 3600)
    assert len(posts) >= 1000
    started = time.perf_counter()
    statuses = asyncio.run(flood(gateway.base_url, posts))
    elapsed = time.perf_counter() - started
    print(f"{len(posts)} posts in {elapsed:.2f} s ({len(posts) / elapsed:.0f}/s): {dict(statuses)}")
    assert count_rows(db, "SELECT count(*) FROM rewards") == expected["rows"]
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'pending'") == LATE * 14

    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        late_ids = {}
        for index in range(LATE):
            response = client.post(
                "/chat/completions",
                headers={"X-Trajectory-Id": f"late-{index}"},
                json={"model": "fake-model", "messages": [{"role": "user", "content": "late"}]},
            )
            late_ids[f"late-{index}"] = response.headers["x-apprentice-trajectory-id"]
    wait_for(
        lambda: count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'pending'") == 0,
        message="late rewards linked",
    )

    assert count_rows(db, "SELECT count(*) FROM rewards") == expected["rows"], "linking adds no rows"
    current = {
        (str(t), name): value
        for t, name, value in db.execute(
            "SELECT trajectory_id, name, value FROM rewards WHERE status = 'linked' AND superseded_at IS NULL"
        )
    }
    wanted = {(late_ids.get(key, key), name): value for (key, name), value in expected["current"].items()}
    assert current == wanted
    keyed = db.execute(
        "SELECT idempotency_key, count(*), count(*) FILTER (WHERE superseded_at IS NULL) "
        "FROM rewards WHERE idempotency_key IS NOT NULL GROUP BY 1"
    ).fetchall()
    assert len(keyed) == 2 * len(targets)
    assert all((n, live) == ((3, 1) if key.startswith("fix-") else (1, 1)) for key, n, live in keyed), keyed


def test_an_idle_keep_alive_connection_outlives_the_clients_expiry(start_gateway):
    """The cause of the ReadErrors this flood used to hit on a loaded machine: httpx keeps an idle
    connection for 5 s (keepalive_expiry) and uvicorn closed it after 5 s (its default), so a
    post reusing a connection idle for about 5 s raced the server's close (timers run before
    reads in a lagging event loop) and was reset. The gateway now keeps idle connections 75 s
    (gateway/commands/serve.py): a connection idle past the client's expiry still answers."""
    gateway = start_gateway()
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    body = b'{"client_trajectory_id": "idle", "reward": 1}'
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x"}
    connection.request("POST", "/v1/rewards", body=body, headers=headers)
    assert connection.getresponse().read() and connection.sock is not None
    socket_before = connection.sock
    time.sleep(httpx.Limits(max_connections=1).keepalive_expiry + 1)
    connection.request("POST", "/v1/rewards", body=body, headers=headers)
    response = connection.getresponse()
    assert response.status == 200, response.read()
    assert connection.sock is socket_before, "the same connection served both"
    connection.close()
