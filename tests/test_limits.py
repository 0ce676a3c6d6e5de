"""Per-key and per-tenant limits (docs/limits.md), through a real gateway and the official clients.

Each test starts real gateway processes on a fresh PostgreSQL; a 429 must reach the clients as
the typed error they already handle (openai.RateLimitError, anthropic.RateLimitError), with
Retry-After, in the protocol's own error format.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.limits.prices import Prices
from gateway.limits.windows import seconds_until_fits
from gateway.upstreams.routing import UpstreamTarget
from tests.conftest import wait_for
from tests.support.processes import cli

MESSAGES = [{"role": "user", "content": "hello there"}]


def make_keys(database_url: str, *specs: tuple[str, str, dict[str, Any] | None]) -> list[str]:
    """Keys (name, tenant, own limits) created in the store, as `apprentice keys create` does."""
    from apprentice.store.engine import make_async_engine
    from gateway.auth.keys import create_key

    async def create() -> list[str]:
        engine = make_async_engine(database_url)
        try:
            return [(await create_key(engine, name=n, tenant=t, limits=limits))[1] for n, t, limits in specs]
        finally:
            await engine.dispose()

    return asyncio.run(create())


def chat(client: openai.OpenAI) -> Any:
    return client.chat.completions.with_raw_response.create(model="fake-model", messages=MESSAGES)


def test_requests_per_minute_answer_openai_rate_limit_errors_on_every_endpoint(start_gateway, database_url):
    (key,) = make_keys(database_url, ("bot", "acme", {"requests_per_minute": 3}))
    gateway = start_gateway(auth={"mode": "keys"})
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)

    remaining = []
    for _ in range(3):
        raw = chat(client)
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        remaining.append(int(raw.headers["x-ratelimit-remaining-requests"]))
        assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
    assert remaining == [2, 1, 0]

    with pytest.raises(openai.RateLimitError) as refused:
        chat(client)
    error = refused.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded" and error.type == "requests"
    assert "requests per min (RPM): Limit 3" in error.message
    retry_after = int(error.response.headers["retry-after"])
    assert 1 <= retry_after <= 120
    assert error.response.json()["error"]["param"] is None  # OpenAI's error body, all four fields

    # The same key's limit holds on the forwarded endpoints and on Anthropic's Messages API.
    with pytest.raises(openai.RateLimitError) as embeddings:
        client.embeddings.create(model="fake-model", input="x")
    assert embeddings.value.code == "rate_limit_exceeded" and "retry-after" in embeddings.value.response.headers
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="fake-model", prompt="x")
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as messages:
        claude.messages.create(model="fake-model", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    body = messages.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert int(messages.value.response.headers["retry-after"]) >= 1


def test_a_tenant_limit_covers_all_its_keys_and_other_tenants_are_free(start_gateway, database_url):
    first, second, other = make_keys(database_url, ("a", "acme", None), ("b", "acme", None), ("c", "globex", None))
    gateway = start_gateway(auth={"mode": "keys"}, limits={"tenants": {"acme": {"requests_per_minute": 4}}})
    clients = [openai.OpenAI(base_url=gateway.base_url, api_key=k, max_retries=0) for k in (first, second)]
    for position in range(4):
        chat(clients[position % 2])
    for client in clients:
        with pytest.raises(openai.RateLimitError, match="tenant acme"):
            chat(client)
    globex = openai.OpenAI(base_url=gateway.base_url, api_key=other, max_retries=0)
    for _ in range(6):
        assert chat(globex).http_response.status_code == 200


def test_tokens_per_minute_count_the_estimate_before_and_the_usage_after(start_gateway, database_url):
    (key,) = make_keys(database_url, ("bot", "acme", {"tokens_per_minute": 120}))
    gateway = start_gateway(auth={"mode": "keys"})
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    used = 0
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(20):
            raw = chat(client)
            assert raw.headers["x-ratelimit-limit-tokens"] == "120"
            used += raw.parse().usage.total_tokens  # the fake upstream answers 20 words: ~25 tokens a call
    assert refused.value.type == "tokens" and "tokens per min (TPM): Limit 120" in refused.value.message
    # Admitted while the usage counted so far plus this call's estimate fitted: never more than
    # the limit plus what the last admitted call used beyond its estimate.
    assert 90 <= used <= 120 + 30, used
    # A request that alone is over the limit says so, instead of waiting in vain.
    with pytest.raises(openai.RateLimitError, match="this request alone is over the limit"):
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x" * 2000}])


def test_spend_budget_uses_model_info_prices_and_refuses_until_the_window_ends(
    start_gateway, database_url, db, fake_upstream
):
    (key,) = make_keys(database_url, ("bot", "acme", {"budget_usd": 0.05}))
    model = {
        "model_name": "fake-model",
        "litellm_params": {"model": "openai/fake-model", "api_base": fake_upstream.api_base, "api_key": "sk-x"},
        "model_info": {"input_cost_per_token": 0.001, "output_cost_per_token": 0.002},
    }
    gateway = start_gateway(auth={"mode": "keys"}, limits={"budget_window_s": 3600}, model_list=[model])
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    first = chat(client).parse()  # 5 prompt + 20 completion tokens: $0.045, under the budget
    assert first.usage.prompt_tokens * 0.001 + first.usage.completion_tokens * 0.002 < 0.05
    chat(client)  # $0.09 now: over, and the next call is refused
    with pytest.raises(openai.RateLimitError) as refused:
        chat(client)
    error = refused.value
    assert error.code == "insufficient_quota" and "Budget reached for key" in error.message
    window_left = 3600 - time.time() % 3600
    assert abs(int(error.response.headers["retry-after"]) - window_left) <= 5
    # The spend is shared through PostgreSQL (a restarted or another process sees it).
    query = "SELECT coalesce(sum(spend_usd), 0) FROM limit_counters WHERE window_s = 3600"
    spent = wait_for(lambda: (value := db.execute(query).fetchone()[0]) > 0.089 and value)
    assert spent == pytest.approx(0.09, rel=0.01)


def test_litellm_cost_map_prices_known_models_without_importing_litellm():
    import sys

    prices = Prices([])
    prices.load()
    assert "litellm" not in sys.modules
    target = UpstreamTarget("gpt", True, "http://x", "gpt-4o-mini", None, 1.0, litellm_model="openai/gpt-4o-mini")
    price_in, price_out = prices.per_token(target)
    assert 0 < price_in < price_out  # gpt-4o-mini: $0.15 and $0.60 per million tokens
    assert prices.cost(target, 1_000_000, 0) == pytest.approx(price_in * 1_000_000)
    policy = UpstreamTarget("p@e", True, "http://x", "p", None, 1.0)
    assert prices.per_token(policy) is None and prices.cost(policy, 100, 100) == 0.0


def test_retry_after_is_when_the_sliding_window_frees_enough():
    # 20 of 20 used in this window, 30 s in: the next fits once 5% of the next window has passed.
    assert seconds_until_fits(0, 20, 1, 20, now=30.0, window_s=60) == pytest.approx(33.0)
    # 20 in the previous window, 5 now, at the start: the previous share must decay to 14.
    assert seconds_until_fits(20, 5, 1, 20, now=0.0, window_s=60) == pytest.approx(18.0)
    assert seconds_until_fits(20, 0, 1, 20, now=30.0, window_s=60) == 0.0


def test_the_limit_holds_across_two_gateway_processes_within_the_stated_bound(start_gateway, database_url, tmp_path):
    """Two gateways on one database, one key at 20 RPM, requests alternating between them.

    docs/limits.md: the processes together admit at most the limit plus what the other process
    admits in two sync intervals (plus one for the sliding window's decay over the test). Not
    sharing would admit 40.
    """
    limit, interval = 20, 0.2
    (key,) = make_keys(database_url, ("bot", "acme", {"requests_per_minute": limit}))
    settings = {"auth": {"mode": "keys"}, "limits": {"sync_interval_s": interval}}
    gateways = [start_gateway(data_dir=tmp_path / name, **settings) for name in ("a", "b")]
    clients = [openai.OpenAI(base_url=g.base_url, api_key=key, max_retries=0) for g in gateways]
    admitted, started = [0, 0], time.monotonic()
    for position in range(80):
        try:
            chat(clients[position % 2])
            admitted[position % 2] += 1
        except openai.RateLimitError:
            pass
        time.sleep(0.04)
    elapsed = time.monotonic() - started
    per_process_rate = 40 / elapsed  # requests a second sent to each process
    bound = limit + per_process_rate * 2 * interval + 1
    print(f"two replicas: admitted {admitted} (sum {sum(admitted)}) of 80 at limit {limit}, bound {bound:.1f}")
    assert limit <= sum(admitted) <= bound, (admitted, bound)
    assert min(admitted) >= 1, admitted  # both processes admitted some: the limit is shared, not local


def test_key_limits_set_by_cli_and_admin_api_apply_within_the_cache_ttl(start_gateway, database_url, tmp_path):
    (key,) = make_keys(database_url, ("bot", "acme", None))
    admin = "admin-" + uuid.uuid4().hex
    gateway = start_gateway(
        auth={"mode": "keys", "key_cache_ttl_s": 0.5, "admin_key": "os.environ/LIMITS_ADMIN_KEY"},
        env={"LIMITS_ADMIN_KEY": admin},
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    for _ in range(5):
        chat(client)  # no limits yet

    changed = cli(database_url, tmp_path, "keys", "limits", key[:12], "--rpm", "2", "--tpm", "none")
    assert changed.returncode == 0, changed.stderr
    assert '"requests_per_minute": 2' in changed.stdout and '"tokens_per_minute": null' in changed.stdout
    listed = cli(database_url, tmp_path, "keys", "list")
    assert '"requests_per_minute": 2' in listed.stdout

    set_at = time.monotonic()

    def refused() -> bool:
        try:
            chat(client)
        except openai.RateLimitError:
            return True
        return False

    wait_for(refused, timeout=10, interval=0.05, message="the CLI's limit to apply")
    assert time.monotonic() - set_at < 0.5 + 1.5  # the key refresh interval, and a margin for the calls

    headers = {"Authorization": f"Bearer {admin}"}
    keys = httpx.get(gateway.base_url + "/admin/keys", headers=headers).json()["keys"]
    (row,) = [k for k in keys if k["key_prefix"] == key[:12]]
    assert row["limits"] == {"requests_per_minute": 2, "tokens_per_minute": None}
    put = httpx.put(
        gateway.base_url + f"/admin/keys/{row['id']}/limits", headers=headers, json={"requests_per_minute": 1000}
    )
    assert put.status_code == 200 and put.json()["limits"] == {"requests_per_minute": 1000}
    assert chat(client).headers["x-ratelimit-limit-requests"] == "1000"  # this process refreshed at once
    bad = httpx.put(gateway.base_url + f"/admin/keys/{row['id']}/limits", headers=headers, json={"rpm": 5})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    client_key = httpx.put(
        gateway.base_url + f"/admin/keys/{row['id']}/limits", headers={"Authorization": f"Bearer {key}"}, json={}
    )
    assert client_key.status_code == 403

    created = httpx.post(
        gateway.base_url + "/admin/keys",
        headers=headers,
        json={"name": "capped", "tenant": "acme", "limits": {"requests_per_minute": 1}},
    )
    assert created.status_code == 201
    capped = openai.OpenAI(base_url=gateway.base_url, api_key=created.json()["key"], max_retries=0)
    chat(capped)
    with pytest.raises(openai.RateLimitError):
        chat(capped)

    # A key created by the CLI with its limits is limited from its first call.
    made = cli(database_url, tmp_path, "keys", "create", "--name", "cli", "--tenant", "acme", "--rpm", "1")
    assert made.returncode == 0, made.stderr
    from_cli = openai.OpenAI(base_url=gateway.base_url, api_key=made.stdout.strip(), max_retries=0)
    assert chat(from_cli).headers["x-ratelimit-limit-requests"] == "1"
    with pytest.raises(openai.RateLimitError):
        chat(from_cli)
    refused = cli(database_url, tmp_path, "keys", "create", "--name", "bad", "--rpm", "0")
    assert refused.returncode == 2 and "greater than or equal to 1" in refused.stderr


def test_the_limit_holds_across_two_worker_processes_of_one_gateway(start_gateway, database_url, db):
    """`workers: 2` behind one port: new connections land on either worker, and the workers
    together stay within the bound."""
    limit, interval, sent = 20, 0.2, 60
    (key,) = make_keys(database_url, ("bot", "acme", {"requests_per_minute": limit}))
    gateway = start_gateway(workers=2, auth={"mode": "keys"}, limits={"sync_interval_s": interval})
    client = openai.OpenAI(
        base_url=gateway.base_url, api_key=key, max_retries=0, default_headers={"Connection": "close"}
    )
    started = time.monotonic()

    # A large body keeps the worker that reads it busy (parsing, hashing, journaling) for a few
    # milliseconds, so the next connection is accepted by the other worker.
    large = [{"role": "user", "content": "word " * 200_000}]

    def one(_: int) -> int:
        try:
            client.chat.completions.create(model="fake-model", messages=large)
            return 1
        except openai.RateLimitError:
            return 0
        finally:
            time.sleep(0.12)

    # Four at a time, so that while one worker answers the other accepts the next connection.
    with ThreadPoolExecutor(4) as pool:
        admitted = sum(pool.map(one, range(sent)))
    rate = sent / (time.monotonic() - started)  # all processes together: (N - 1) x r is at most this
    print(f"two workers: admitted {admitted} of {sent} at limit {limit}, bound {limit + rate * 2 * interval + 1:.1f}")
    assert limit <= admitted <= limit + rate * 2 * interval + 1, (admitted, rate)
    # Which worker accepts a connection is the kernel's choice (both admitted in about half the runs
    # here): shown, not asserted; the two-replica test above pins the split between processes.
    workers = "SELECT count(DISTINCT process_id) FROM limit_counters WHERE scope LIKE 'key:%%'"
    print(f"two workers: {wait_for(lambda: db.execute(workers).fetchone()[0])} of them admitted calls")
