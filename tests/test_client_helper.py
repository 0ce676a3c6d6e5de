"""The client helper (clients/python/apprentice_client) against a real gateway.

Naming and grouping: calls of the official openai and anthropic SDKs and of langchain-openai's
ChatOpenAI, made inside `run(...)`, land in the run's trajectory and group, and calls outside
stay unnamed; concurrent asyncio runs sharing one client never get each other's ids. Rewards:
idempotent (a resend is answered from the stored reward), batched (one all-or-nothing
request), signed (the gateway's webhook scheme; a wrong secret is refused and not retried),
and retried through a PostgreSQL outage (503, waiting at least its Retry-After) and a 429 (the
tenant's pending bound) until the gateway stores them, once.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI
from sqlalchemy.engine import make_url

import apprentice_client as ac
from apprentice_client.retry import parse_retry_after
from tests.conftest import count_rows, wait_for
from tests.support.agent_runs import CLIENT_PATH
from tests.support.tcp_proxy import CuttableProxy

SECRET = "whsec-client-helper-test"
FAST = ac.RetryPolicy(max_attempts=8, initial_backoff_s=0.2, max_backoff_s=1.0)


def trajectory(gateway: Any, trajectory_id: str, calls: int) -> dict[str, Any]:
    def stored() -> dict[str, Any] | None:
        answer = httpx.get(f"{gateway.base_url}/trajectories/{trajectory_id}", timeout=30)
        return answer.json() if answer.status_code == 200 and answer.json()["call_count"] >= calls else None

    return wait_for(stored, timeout=30, message=f"{calls} calls of {trajectory_id}")


def user_texts(found: dict[str, Any]) -> list[str]:
    return [call["request"]["messages"][-1]["content"] for call in found["calls"]]


def test_runs_name_and_group_the_calls_of_openai_anthropic_and_langchain_clients(start_gateway, db):
    gateway = start_gateway()
    chat = openai.OpenAI(base_url=gateway.base_url, api_key="k", http_client=ac.http_client(), max_retries=0)
    messages = anthropic.Anthropic(base_url=gateway.url, api_key="k", http_client=ac.http_client(), max_retries=0)
    langchain = ChatOpenAI(model="fake-model", base_url=gateway.base_url, api_key="k", http_client=ac.http_client())

    def ask(text: str) -> None:
        chat.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": f"openai {text}"}])
        messages.messages.create(
            model="fake-model", max_tokens=32, messages=[{"role": "user", "content": f"anthropic {text}"}]
        )
        langchain.invoke(f"langchain {text}")

    with ac.run("ticket-4711", group_id="tickets") as outer:
        assert ac.current_run() == outer
        ask("first")
        with ac.run(group_id="tickets") as inner:  # a nested run is its own trajectory, with a fresh id
            chat.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "inner"}])
        assert ac.current_run() == outer and inner.trajectory_id.startswith("run-")
        ask("second")
    assert ac.current_run() is None
    chat.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "outside any run"}])
    # a header the caller gives on the call itself is left as it is
    with ac.run("ignored-for-this-call"):
        chat.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "explicit"}],
            extra_headers={ac.TRAJECTORY_HEADER: "explicit-run"},
        )

    named = trajectory(gateway, "ticket-4711", 6)
    assert named["client_trajectory_id"] == "ticket-4711" and named["group_id"] == "tickets"
    assert user_texts(named) == [
        f"{sdk} {turn}" for turn in ("first", "second") for sdk in ("openai", "anthropic", "langchain")
    ]
    nested = trajectory(gateway, inner.trajectory_id, 1)
    assert user_texts(nested) == ["inner"] and nested["group_id"] == "tickets"
    assert user_texts(trajectory(gateway, "explicit-run", 1)) == ["explicit"]
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 9)
    unnamed = db.execute(
        "SELECT t.client_trajectory_id, t.group_id FROM calls c JOIN trajectories t ON t.id = c.trajectory_id "
        "WHERE c.request->'messages'->0->>'content' = 'outside any run'"
    ).fetchall()
    assert unnamed == [(None, None)], "a call outside every run carries no run headers"
    assert count_rows(db, "SELECT count(*) FROM trajectories WHERE client_trajectory_id = 'ignored-for-this-call'") == 0


async def test_concurrent_runs_sharing_one_async_client_never_get_each_others_ids(start_gateway):
    gateway = start_gateway()
    client = openai.AsyncOpenAI(
        base_url=gateway.base_url, api_key="k", http_client=ac.async_http_client(), max_retries=0
    )
    runs = 12

    async def one_run(index: int) -> str:
        with ac.run(f"concurrent-{index}", group_id=f"group-{index % 3}") as run:
            for step in range(3):
                await asyncio.sleep(0.01 * ((index * 7 + step * 3) % 5))  # interleave the runs' calls
                await client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": f"run {index} step {step}"}]
                )
                assert ac.current_run() == run
            return run.trajectory_id

    ids = await asyncio.gather(*(one_run(i) for i in range(runs)))
    assert ids == [f"concurrent-{i}" for i in range(runs)]
    for index in range(runs):
        found = await asyncio.to_thread(trajectory, gateway, f"concurrent-{index}", 3)
        assert found["call_count"] == 3 and found["group_id"] == f"group-{index % 3}"
        assert user_texts(found) == [f"run {index} step {step}" for step in range(3)]
    await client.close()


def test_rewards_are_idempotent_batched_and_signed(start_gateway, db):
    gateway = start_gateway(rewards={"webhook_secrets": [{"name": "crm", "secret": SECRET, "tenant": "local"}]})
    chat = openai.OpenAI(base_url=gateway.base_url, api_key="k", http_client=ac.http_client(), max_retries=0)
    with ac.run(group_id="rewarded") as run:
        chat.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "reward me"}])
    trajectory(gateway, run.trajectory_id, 1)

    attempts: list[ac.Attempt] = []
    with ac.RewardClient(gateway.base_url, api_key="k", on_attempt=attempts.append) as rewards:
        reward = ac.Reward.for_run(run, 0.5, metrics={"steps": 1})
        first = rewards.post(reward)
        again = rewards.post(reward)  # a resend of the same reward (same idempotency key)
        assert first.status == "linked" and first.current and not first.replayed
        assert again.id == first.id and again.replayed
        assert [a.status for a in attempts] == [200, 200]

        batch = rewards.post_batch(
            [
                ac.Reward.for_run(run, 0.75, name="helpfulness"),
                ac.Reward(reward=1.0, client_trajectory_id="not-yet-run"),
            ]
        )
        assert [(s.name, s.status) for s in batch] == [("helpfulness", "linked"), ("reward", "pending")]

        with pytest.raises(ac.RewardError) as refused:  # a batch with one bad item stores nothing
            rewards.post_batch([ac.Reward.for_run(run, 0.1), ac.Reward.for_run(run, 0.2, name="bad name!")])
        assert refused.value.status == 400 and refused.value.param == "rewards[1].name"
        assert attempts[-1].status == 400 and attempts[-1].delay_s is None, "a refusal is final: not retried"
    stored = db.execute(
        "SELECT name, value, group_id FROM rewards WHERE target = %s ORDER BY received_at", (run.trajectory_id,)
    ).fetchall()
    assert stored == [("reward", 0.5, "rewarded"), ("helpfulness", 0.75, "rewarded")]

    with ac.RewardClient(gateway.base_url, webhook_secret=SECRET) as signed:
        answer = signed.post(ac.Reward.for_run(run, 1.0, idempotency_key=f"{run.trajectory_id}:final"))
        assert answer.status == "linked" and answer.current and answer.reward == 1.0
    assert count_rows(db, "SELECT count(*) FROM reward_signatures") == 1
    with ac.RewardClient(gateway.base_url, webhook_secret="not-the-secret", on_attempt=attempts.append) as forged:
        with pytest.raises(ac.RewardError) as bad:
            forged.post(ac.Reward.for_run(run, 0.0))
    assert bad.value.status == 401 and bad.value.code == "invalid_signature" and attempts[-1].delay_s is None
    current = httpx.get(f"{gateway.base_url}/trajectories/{run.trajectory_id}").json()["reward"]
    assert current == 1.0


def test_a_reward_is_retried_through_a_database_outage_and_stored_once(start_gateway, database_url, db):
    url = make_url(database_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432).start()
    try:
        gateway = start_gateway(database_url=url.set(host="127.0.0.1", port=proxy.port).render_as_string(False))
        attempts: list[tuple[float, ac.Attempt]] = []
        result: list[Any] = []
        proxy.cut()
        client = ac.RewardClient(
            gateway.base_url, api_key="k", retry=FAST, on_attempt=lambda a: attempts.append((time.monotonic(), a))
        )
        sender = threading.Thread(target=lambda: result.append(client.post(ac.Reward(1.0, call_id="chatcmpl-late"))))
        sender.start()
        wait_for(lambda: len(attempts) >= 2, timeout=60, message="two refused attempts")
        proxy.restore()
        sender.join(60)
        client.close()
    finally:
        proxy.close()
    [stored] = result
    assert stored.status == "pending" and not stored.replayed
    statuses = [a.status for _, a in attempts]
    assert statuses[0] == 503 and statuses[-1] == 200 and set(statuses) <= {503, 200}
    gaps = [later - earlier for (earlier, _), (later, _) in zip(attempts, attempts[1:], strict=False)]
    assert all(gap >= 0.95 for gap in gaps), f"Retry-After: 1 is honoured although backoff is 0.2-1 s ({gaps})"
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE target = 'chatcmpl-late'") == 1


def test_a_reward_refused_by_the_pending_bound_is_retried_until_it_fits(start_gateway, db):
    gateway = start_gateway(rewards={"max_pending_per_tenant": 1})
    attempts: list[ac.Attempt] = []
    with ac.RewardClient(gateway.base_url, api_key="k", retry=FAST, on_attempt=attempts.append) as rewards:
        assert rewards.post(ac.Reward(1.0, client_trajectory_id="run-a")).status == "pending"
        result: list[Any] = []
        sender = threading.Thread(
            target=lambda: result.append(rewards.post(ac.Reward(0.0, client_trajectory_id="run-b")))
        )
        sender.start()
        wait_for(lambda: any(a.status == 429 for a in attempts), timeout=30, message="a 429")
        # run-a's calls arrive: its reward links and frees the tenant's one pending place
        chat = openai.OpenAI(base_url=gateway.base_url, api_key="k", http_client=ac.http_client(), max_retries=0)
        with ac.run("run-a"):
            chat.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a"}])
        sender.join(60)
    [stored] = result
    assert stored.status == "pending" and [a.status for a in attempts][-1] == 200
    assert 429 in [a.status for a in attempts[1:-1]]
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE target = 'run-b'") == 1


def test_the_distribution_installs_and_imports_without_the_gateway(tmp_path):
    target = tmp_path / "site"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(CLIENT_PATH),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    assert (target / "apprentice_client" / "py.typed").exists()
    probe = (
        "import sys, apprentice_client as ac; "
        "assert ac.__file__.startswith(sys.argv[1]), ac.__file__; "
        "assert not {'apprentice', 'gateway', 'learner'} & set(sys.modules), 'imports the project'; "
        "print(ac.Reward(1.0, call_id='chatcmpl-1').to_json()['reward'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(target)],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "1.0", done.stderr


def test_retry_after_and_run_names_are_read_as_the_gateway_means_them():
    assert parse_retry_after("3") == 3.0 and parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    policy = ac.RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.4, max_retry_after_s=5)
    assert 5.0 == policy.delay_s(1, "3600") and 2.0 == policy.delay_s(1, "2") and policy.delay_s(9, None) <= 0.4
    with pytest.raises(ValueError):
        ac.Run("x" * 257)
    with pytest.raises(ValueError):
        ac.Run("line\nbreak")
    with pytest.raises(ValueError):
        ac.Reward(float("nan"), call_id="c")
    with pytest.raises(ValueError):
        ac.Reward(1.0, call_id="c", trajectory_id="t")
